"""The Space's files and its Gradio handler (function level; the browser test drives the served page)."""

import pytest

from tests.conftest import REPO_ROOT, requires

SPACE = REPO_ROOT / "spaces_app"


def test_space_front_matter_is_valid_and_matches_the_space_extra():
    from huggingface_hub import SpaceCard
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11 reads pyproject.toml")
    card = SpaceCard.load(SPACE / "README.md")
    assert card.data.sdk == "gradio" and card.data.title
    assert (SPACE / card.data.app_file).is_file()
    assert len(card.data.short_description) <= 60  # the Hub's limit
    extras = tomllib.loads((SPACE.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    gradio = next(Requirement(r) for r in extras["space"] if Requirement(r).name == "gradio")
    assert gradio.specifier.contains(card.data.sdk_version)


def test_space_requirements_come_from_the_package_metadata_and_are_all_on_pypi():
    from packaging.requirements import Requirement

    from grpo_hub.compare.deploy import space_requirements

    text = (SPACE / "requirements.txt").read_text()
    assert text == space_requirements(), "regenerate spaces_app/requirements.txt from grpo_hub.compare.deploy"
    names = {Requirement(line).name for line in text.splitlines() if line.strip()}
    assert {"trl", "peft", "gradio"} <= names and "grpo-hub" not in names  # the Space ships grpo_hub's source


def test_space_files_hold_the_package_source_and_the_shipped_chain_model():
    from grpo_hub.compare.deploy import space_files

    files = space_files()
    shipped = [f"grpo_hub/tasks/data/chain-model/{name}" for name in ("model.safetensors", "tokenizer.json")]
    assert {"app.py", "README.md", "requirements.txt", "grpo_hub/compare/space.py", *shipped} <= set(files)
    assert not [name for name in files if "__pycache__" in name or "/." in name]  # no caches, no hidden files


@pytest.fixture
def app():
    requires("gradio", "the Space's UI")
    from grpo_hub.compare import space as app

    return app


def test_handler_shows_one_column_per_model_and_hides_the_rest(app, tiny_model_dir, random_adapter):
    outputs = app.run_compare(
        tiny_model_dir, random_adapter, "Write only digits: 1", 1.0, 1.0, 8, 0, 2, ["digit_fraction_reward"]
    )
    slots, chart, columns = outputs[:-2], outputs[-2], outputs[-1]
    assert [o.visible for o in slots] == [True, True, False, False, False]
    assert "<h3>base</h3>" in slots[0].value and f"<h3>{random_adapter}</h3>" in slots[1].value
    assert slots[1].value.count('class="sample"') == 2 and "<ins>" not in slots[1].value  # plain by default
    assert "vs base)" in slots[1].value and "vs base)" not in slots[0].value
    means = [c.mean_reward("digit_fraction_reward") for c in columns]
    rows = chart.value["data"]
    assert chart.visible and [(r[0], r[2]) for r in rows] == [
        ("base", "digit_fraction_reward"),
        ("adapter", "digit_fraction_reward"),
    ]
    assert [r[1] for r in rows] == pytest.approx(means, abs=1e-6)
    with_diff = app.render_columns(columns, show_diff=True)
    assert ("<ins>" in with_diff[1].value or "<del>" in with_diff[1].value) and "<ins>" not in with_diff[
        0
    ].value


@pytest.mark.parametrize(
    ("adapters", "prompt", "n", "match"),
    [
        ("/no/such/adapter", "Write only digits: 1", 2, "not found: no such folder"),
        ("", "Write only digits: 1", 99, "n samples 99"),
        ("", "", 2, "prompt is empty"),
        ("", "Write only digits: 1", None, "every sampling control needs a number"),
    ],
)
def test_handler_turns_problems_into_gradio_errors(app, tiny_model_dir, adapters, prompt, n, match):
    import gradio as gr

    with pytest.raises(gr.Error, match=match) as raised:
        app.run_compare(tiny_model_dir, adapters, prompt, 1.0, 1.0, 8, 0, n, ["digit_fraction_reward"])
    assert raised.value.duration is None  # stays on the page until closed


@pytest.mark.parametrize(
    ("temperature", "seed", "match"),
    [
        (1.0, 1e20, r"seed 100000000000000000000 is outside \[0, 4294967295\]"),
        (1.0, -1, r"seed -1 is outside"),
        (1.0, float("inf"), "every sampling control needs a number"),
        (1.0, float("nan"), "every sampling control needs a number"),
        (float("nan"), 0, "temperature nan is outside"),
        (float("inf"), 0, "temperature inf is outside"),
    ],
)
def test_handler_bounds_every_control(app, tiny_model_dir, temperature, seed, match):
    import gradio as gr

    with pytest.raises(gr.Error, match=match):
        app.run_compare(tiny_model_dir, "", "Write only digits: 1", temperature, 1.0, 8, seed, 2, [])


def test_handler_turns_an_unexpected_error_into_a_message(app, tiny_model_dir, monkeypatch):
    import gradio as gr

    def broken(*args, **kwargs):
        raise RuntimeError("something deep broke")

    monkeypatch.setattr(app, "compare", broken)
    with pytest.raises(
        gr.Error, match=r"failed unexpectedly \(RuntimeError: something deep broke\)"
    ) as raised:
        app.run_compare(tiny_model_dir, "", "Write only digits: 1", 1.0, 1.0, 8, 0, 2, [])
    assert raised.value.duration is None


def test_handler_rejects_a_foreign_adapter(app, tiny_model_dir, foreign_adapter):
    import gradio as gr

    with pytest.raises(gr.Error, match="trained on base 'someone/another-model'"):
        app.run_compare(tiny_model_dir, foreign_adapter, "Write only digits: 1", 1.0, 1.0, 8, 0, 2, [])


def test_default_config_finds_the_recipe_outputs(app, tiny_model_dir, random_adapter, tmp_path, monkeypatch):
    import shutil

    import grpo_hub.tasks

    shutil.copytree(random_adapter, tmp_path / "run")
    assert grpo_hub.tasks.DEFAULT_COMPARE_BASE == "chain"  # the recipe's default task
    monkeypatch.setitem(grpo_hub.tasks.OFFLINE_MODELS, "chain", lambda: tiny_model_dir)
    monkeypatch.delenv("GRPO_HUB_BASE_MODEL", raising=False)
    monkeypatch.delenv("GRPO_HUB_ADAPTERS", raising=False)
    monkeypatch.setenv("GRPO_HUB_OUTPUT_DIR", str(tmp_path))
    assert app.default_config() == (tiny_model_dir, str(tmp_path / "run"))
    monkeypatch.setenv("GRPO_HUB_ADAPTERS", "me/a@v1")
    assert app.default_config()[1] == "me/a@v1"


def test_cli_compare_reports_a_bad_configuration_before_serving(app, tiny_model_dir, monkeypatch, capsys):
    from grpo_hub.cli import main

    monkeypatch.setenv("GRPO_HUB_BASE_MODEL", tiny_model_dir)
    monkeypatch.setenv("GRPO_HUB_ADAPTERS", "/no/such/adapter")
    assert main(["compare", "--port", "1"]) == 1
    assert "grpo-hub: error: adapter '/no/such/adapter' not found" in capsys.readouterr().err
