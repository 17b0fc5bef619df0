"""JupyterLab in a real browser: notebook 02 runs, a slider moves, the heatmap redraws.

Needs Debian's chromium (`.ci/run` installs it) and the stage-01 ci dataset (`make test` runs the
notebooks before this test). Playwright drives /usr/bin/chromium; it never downloads a browser.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from draftlab.layout import RunLayout

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian chromium is not installed: `apt-get install -y chromium` (.ci/run does this)")
    if not (RunLayout("smollm2-ci", "ci", ROOT).split("train") / "manifest.json").exists():
        pytest.fail("No ci dataset: run `draftlab run --profile ci --only 01` first (make test does).")
    work = tmp_path_factory.mktemp("lab")  # a copy, so autosave never writes outputs into the repo
    shutil.copy(ROOT / "notebooks" / "02_attention_masks.ipynb", work)
    port, token = _free_port(), "draftlab-test"
    # Fresh lab settings and workspaces each time, as on a new CI machine: no state from earlier runs.
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(work / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(work / "ws"),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={work}",
            "--ServerApp.open_browser=False",
            "--allow-root",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "lab.log", "w"),
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        if proc.poll() is not None:
            break
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"JupyterLab did not start: {(work / 'lab.log').read_text()[-2000:]}")
    yield f"{url}/lab/tree/02_attention_masks.ipynb?token={token}"
    proc.terminate()
    proc.wait(timeout=20)


def _explorer_image(page) -> str:
    return page.locator(".widget-output img").first.get_attribute("src") or ""


def test_notebook_02_runs_and_a_slider_redraws_the_heatmap(lab):
    from playwright.sync_api import sync_playwright

    shots = ROOT / "outputs" / "browser"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        try:
            _drive(page, lab, shots)
        except Exception:
            page.screenshot(path=str(shots / "02_failure.png"), full_page=True)
            raise
        finally:
            browser.close()


def _drive(page, lab: str, shots: Path) -> None:
    page.goto(lab)
    page.wait_for_selector(".jp-NotebookPanel", timeout=120_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    page.get_by_text("Python 3 (draftlab) | Idle").wait_for(timeout=120_000)
    news = page.locator(".jp-toast-button", has_text="No")
    if news.count():
        news.first.click()  # the first-run "Jupyter news?" toast, so screenshots stay clean
    # A fresh lab can report idle before the kernel takes requests; retry until the first cell runs.
    for _attempt in range(4):
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        try:
            page.wait_for_function(
                "() => [...document.querySelectorAll('.jp-InputArea-prompt')].some(p "
                "=> /\\[(\\*|\\d+)\\]/.test(p.textContent))",
                timeout=30_000,
            )
            break
        except Exception:  # noqa: BLE001 (not started yet: ask again)
            continue
    slider = page.locator(".widget-slider", has_text="TTT step")
    slider.wait_for(timeout=240_000)
    page.wait_for_function("document.querySelectorAll('.widget-output img').length >= 2", timeout=120_000)
    assert (
        page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']", has_text="Error").count()
        == 0
    )
    before = _explorer_image(page)
    slider.scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "02_before.png"))
    handle = slider.locator(".noUi-handle")
    handle.focus()
    page.keyboard.press("ArrowLeft")  # TTT step 2 -> 1
    page.wait_for_function(
        "(before) => { const i = document.querySelector('.widget-output img'); return i && i.src !== before; }",
        arg=before,
        timeout=60_000,
    )
    assert slider.locator(".widget-readout").inner_text().strip() == "1"
    after = _explorer_image(page)
    assert after and after != before, "the heatmap did not change when the slider moved"
    page.screenshot(path=str(shots / "02_after_slider.png"))
