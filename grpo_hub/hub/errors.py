"""Errors of the Hub workflow: each names the repo/revision, what went wrong and the fix.

`hub_errors(action, repo_id, revision)` turns the `huggingface_hub` client's exceptions (missing or rejected
token, missing repo or revision, HTTP errors, connection failures) into one of the `HubError` subclasses.
"""

from __future__ import annotations

from contextlib import contextmanager

TOKEN_FIX = "pass `token=` / `--token`, set HF_TOKEN, or run `hf auth login`"


class HubError(RuntimeError):
    """A Hub push or pull failed; the message names the repo/revision and the fix."""


class HubAuthError(HubError):
    """The token is missing, rejected, or lacks the rights the operation needs."""


class HubNotFoundError(HubError):
    """The repo, revision or file does not exist (or is private and not visible with this token)."""


class HubConnectionError(HubError):
    """The Hub could not be reached or dropped the connection."""


def _is_connection_error(err: BaseException) -> bool:
    """True when `err` or any exception it wraps is a transport-level failure (refused, reset, timeout)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        names = {cls.__name__ for cls in type(err).__mro__}
        if "TransportError" in names or isinstance(err, ConnectionError | TimeoutError):
            return True
        err = err.__cause__ or err.__context__
    return False


@contextmanager
def hub_errors(action: str, repo_id: str, revision: str | None = None):
    """Re-raise client errors of `action` on `repo_id@revision` as `HubError`s with the cause and the fix."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalTokenNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id}@{revision}" if revision else repo_id
    try:
        yield
    except HubError:
        raise
    except LocalTokenNotFoundError as err:
        raise HubAuthError(f"{action} {where}: no Hub token found. Fix: {TOKEN_FIX}.") from err
    except RevisionNotFoundError as err:
        raise HubNotFoundError(
            f"{action} {where}: revision {revision!r} does not exist in {repo_id}. "
            "Fix: use an existing branch, tag or commit sha (e.g. 'main' or 'step-<N>')."
        ) from err
    except RemoteEntryNotFoundError as err:
        raise HubNotFoundError(
            f"{action} {where}: a file is missing at this revision ({err}). "
            "Fix: point to a revision that holds a pushed adapter (adapter_config.json + adapter_model.safetensors)."
        ) from err
    except RepositoryNotFoundError as err:
        raise HubNotFoundError(
            f"{action} {where}: repository {repo_id!r} not found, or private and not visible with this token. "
            f"Fix: check the repo id; for a private repo use a token of a user with access ({TOKEN_FIX})."
        ) from err
    except HfHubHTTPError as err:
        status = err.response.status_code if err.response is not None else None
        server = err.server_message or str(err).splitlines()[0]
        if status == 401:
            raise HubAuthError(
                f"{action} {where}: the Hub rejected the token (401: {server}). "
                f"Fix: create a new access token at {constants.ENDPOINT}/settings/tokens and {TOKEN_FIX}."
            ) from err
        if status == 403:
            raise HubAuthError(
                f"{action} {where}: the token has no rights for this (403: {server}). "
                "Fix: use a write token of the repo owner or of a member of its organisation."
            ) from err
        raise HubError(f"{action} {where}: the Hub answered HTTP {status}: {server}.") from err
    except Exception as err:
        if not _is_connection_error(err):
            raise
        raise HubConnectionError(
            f"{action} {where}: no answer from the Hub at {constants.ENDPOINT}: connection refused, dropped or timed out ({type(err).__name__}: {err}). "
            "Fix: check the network (and HF_ENDPOINT) and run the same command again; a push is a single commit, "
            "so a failed one leaves the repo as it was."
        ) from err
