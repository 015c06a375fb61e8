"""End to end: the Space served by `python -m spaces_app`, driven in headless Chromium and through its queue.

The server runs in a subprocess on 127.0.0.1 with the tiny base and an adapter trained by GRPO in this
session; it is stopped at the end of the module. The page screenshot is kept in test-artifacts/space.png.
"""

import inspect
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from grpo_hub import compare as C
from grpo_hub.compare import scoring
from grpo_hub.tasks import chain
from tests.compare.conftest import wait_until_served
from tests.conftest import REPO_ROOT, RUN_LIMIT_S, free_port, requires, skip_or_fail

pytestmark = pytest.mark.browser
ROOT = REPO_ROOT
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PROMPT = "Write only digits: 4 1 7"
SEED = 7
TOAST = "[data-testid='toast-body']"  # Gradio's error popup


@pytest.fixture(scope="module")
def space_log(tmp_path_factory) -> Path:
    """The Space server's console (stdout and stderr)."""
    return tmp_path_factory.mktemp("space") / "server.log"


@pytest.fixture(scope="module")
def space_url(tiny_model_dir, trained_adapter, space_log):
    """URL of the Space serving the tiny base + the GRPO-trained adapter; the server is stopped afterwards."""
    requires("gradio", "the Space's UI")
    url = f"http://127.0.0.1:{free_port()}"
    env = os.environ | {
        "GRPO_HUB_BASE_MODEL": tiny_model_dir,
        "GRPO_HUB_ADAPTERS": trained_adapter,
        "GRADIO_ANALYTICS_ENABLED": "False",
        "OMP_NUM_THREADS": "1",
    }
    with space_log.open("w") as out:
        command = [sys.executable, "-m", "spaces_app", "--port", url.rsplit(":", 1)[1]]
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_served(url, process, space_log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=RUN_LIMIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def browser(space_url):
    """Headless Chromium (Debian's, fresh profile), closed after the module."""
    requires("playwright", "the browser test")
    if not Path(CHROMIUM).is_file():
        skip_or_fail(f"{CHROMIUM} is missing: apt-get install -y chromium chromium-driver (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=FLAGS, viewport={"width": 1400, "height": 1000}
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser, space_url):
    """A fresh page on the Space for each test: no test starts from what another left on the page."""
    page = browser.new_page()
    page.goto(space_url)
    yield page
    page.close()


def read_column(page, index: int) -> tuple[list[str], list[float], float]:
    """(completions, digit rewards, mean digit reward) shown in column `index` of the page."""
    samples = page.locator(f"#column-{index} .sample")
    texts = [sample.get_attribute("data-text") for sample in samples.all()]
    rewards = page.locator(f'#column-{index} .reward[data-name="digit_fraction_reward"]')
    values = [float(reward.get_attribute("data-value")) for reward in rewards.all()]
    mean = page.locator(f'#column-{index} .mean-reward[data-name="digit_fraction_reward"]').get_attribute(
        "data-value"
    )
    return texts, values, float(mean)


def test_page_compares_base_and_trained_adapter(page, tiny_model_dir, trained_adapter):
    page.locator("#prompt textarea").fill(PROMPT)
    page.locator("#seed input").fill(str(SEED))
    page.locator("#compare").click()
    page.locator("#column-1 .sample").first.wait_for(timeout=RUN_LIMIT_S * 1000)
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    page.screenshot(path=str(ROOT / "test-artifacts" / "space.png"), full_page=True)

    base, adapter = read_column(page, 0), read_column(page, 1)
    assert page.locator("#column-2").is_hidden()
    bank = C.load_bank(tiny_model_dir, (trained_adapter,))
    new_tokens = chain.MAX_COMPLETION_TOKENS  # the UI's default: a chain scratchpad of the default task fits
    expected = C.compare(bank, PROMPT, C.Sampling(1.0, 1.0, new_tokens, SEED, 4), ["digit_fraction_reward"])
    assert base[0] == expected[0].completions and adapter[0] == expected[1].completions
    assert adapter[0] != base[0]
    for texts, rewards, mean in (base, adapter):
        assert rewards == pytest.approx(
            C.score(["digit_fraction_reward"], PROMPT, texts)["digit_fraction_reward"]
        )
        assert mean == pytest.approx(sum(rewards) / len(rewards))
    assert page.locator("#reward-chart").is_visible()
    assert page.locator("#column-1 ins, #column-1 del").count() == 0  # plain completions by default
    page.locator("#show-diff input").check()
    page.locator("#column-1 ins, #column-1 del").first.wait_for(timeout=RUN_LIMIT_S * 1000)
    assert page.locator("#column-0 ins").count() == 0
    assert read_column(page, 1)[0] == adapter[0]  # the toggle re-renders, it does not sample again
    page.screenshot(path=str(ROOT / "test-artifacts" / "space-diff.png"), full_page=True)


def test_an_example_button_shows_the_question_and_fills_the_chat_text(page):
    prompt = C.example_prompts()[1]  # chain, level 2
    page.get_by_text(scoring.example_label(prompt), exact=True).click()
    page.wait_for_function(
        "text => document.querySelector('#prompt textarea').value === text",
        arg=prompt,
        timeout=RUN_LIMIT_S * 1000,
    )


def test_page_names_an_unknown_adapter(page, space_log):
    """The error stays on the page until the user closes it: a loaded test machine (CI) can look later than
    Gradio's default 10 s toast lasts, and so can a user reading the fix."""
    import gradio as gr
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    page.get_by_text("Models").click()
    adapters = page.locator("#adapters textarea")
    adapters.fill("/no/such/adapter")
    expect(adapters).to_have_value("/no/such/adapter")
    page.locator("#compare").click()
    toast_s = (
        inspect.signature(gr.Error).parameters["duration"].default
    )  # how long Gradio's default toast lasts
    page.wait_for_timeout(toast_s * 1000 + 2000)
    shown = page.locator(f"{TOAST}, #column-0 .sample").first  # an error, or columns: a compare that ran
    try:
        shown.wait_for(timeout=RUN_LIMIT_S * 1000)
    except PlaywrightTimeout:
        pytest.fail(
            f"the page shows nothing:\n{page.inner_text('body')[-2000:]}\nserver:\n{space_log.read_text()[-3000:]}"
        )
    assert "adapter '/no/such/adapter' not found" in " ".join(page.locator(TOAST).all_inner_texts()), (
        page.inner_text("body")[-2000:]
    )


def test_twenty_concurrent_requests_complete(space_url, tiny_model_dir, trained_adapter):
    from gradio_client import Client

    client = Client(space_url, verbose=False)
    controls = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 4, "n": 1}
    jobs = [
        client.submit(
            tiny_model_dir, trained_adapter, PROMPT, 1.0, 1.0, 4, seed, 1, [], False, api_name="/compare"
        )
        for seed in range(20)
    ]
    results = [job.result(timeout=RUN_LIMIT_S) for job in jobs]
    bank = C.load_bank(tiny_model_dir, (trained_adapter,))
    for seed, result in enumerate(results):
        expected = C.compare(bank, PROMPT, C.Sampling(seed=seed, **controls), [])
        assert [update["visible"] for update in result[:5]] == [True, True, False, False, False]
        html = [C.column_html(column, base=expected[0]) for column in expected]
        assert [update["value"] for update in result[:2]] == html
