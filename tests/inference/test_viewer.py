"""The HTML run viewer: self-contained page, and (marker ``browser``) headless Chromium.

The browser tests open the page with ``#selftest``: the page moves its own step
control and writes what it showed into ``body[data-selftest]``; ``body[data-errors]``
counts ``window.onerror`` and ``console.error`` calls. ``--dump-dom`` returns the DOM
after the page's scripts ran.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess

import pytest
from programs import EOS, AllFailProgram, toy_lm

from llamppl import FunctionLM, LMContext, Model, run
from llamppl.inference import smc_standard
from llamppl.inference.record import frame_texts
from llamppl.inference.viewer import render_html


class Walk(Model):
    """Up to 8 tokens, no "b": particles die, finish at different times, get resampled."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.context = LMContext(lm, [0])

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        self.condition("b" not in str(self.context))
        if token == EOS or len(self.context.generated) >= 8:
            self.finish()


def walk_result():
    return run(smc_standard(Walk(toy_lm()), 16, 0.5, seed=3, record=True))


class Tokens(Model):
    """Up to 4 tokens of ``lm`` (uniform), then stop: every token string shows up somewhere."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.context = LMContext(lm, [0])

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        if token in self.context.lm.eos_token_ids or len(self.context.generated) >= 4:
            self.finish()


def tokens_result(vocab: list[str]):
    lm = FunctionLM(vocab, len(vocab) - 1, lambda ctx: [0.0] * len(vocab))
    return run(smc_standard(Tokens(lm), 16, 0.5, seed=0, record=True))


def test_lone_surrogate_is_recorded_as_the_replacement_character(tmp_path):
    record = tokens_result(["a", "\ud800", "<eos>"]).record
    texts = [t for frame in frame_texts(record) for t in frame]
    assert any("\ufffd" in t for t in texts)
    assert not any(re.search("[\ud800-\udfff]", t) for t in texts)
    page = render_html(record)
    page.encode("utf-8")  # strict UTF-8: no surrogate left
    assert json.loads(re.search(r'type="application/json">(.*?)</script>', page, re.S)[1]) == record


def test_page_is_self_contained_and_embeds_the_record(tmp_path):
    result = walk_result()
    page = result.to_html(tmp_path / "run.html").read_text(encoding="utf-8")
    urls = set(re.findall(r"https?://[^\"'\s)]+", page))
    assert urls == {"http://www.w3.org/2000/svg"}  # the SVG namespace, never fetched
    assert "<link" not in page and not re.search(r"<script[^>]*\bsrc=", page)
    embedded = re.search(r'<script id="record" type="application/json">(.*?)</script>', page, re.S)
    assert json.loads(embedded.group(1)) == result.record


def test_record_text_cannot_close_the_script_tag():
    record = walk_result().record
    record["final"][0].pop("append", None)
    record["final"][0]["text"] = "</script><script>alert(1)</script>"
    page = render_html(record)
    assert page.count("</script>") == 2  # the page's own two scripts


def test_bad_record_is_refused():
    with pytest.raises(ValueError, match="run record"):
        render_html({"steps": []})


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not found (apt-get install chromium; scripts/test.sh installs it as root)",
)


def chromium(tmp_path, *args: str) -> str:
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout


def body_data(dom: str) -> dict[str, str]:
    body = re.search(r"<body([^>]*)>", dom).group(1)
    return {k: html.unescape(v) for k, v in re.findall(r'data-([\w-]+)="([^"]*)"', body)}


@pytest.mark.browser
@needs_chromium
def test_viewer_in_headless_chromium(tmp_path):
    result = walk_result()
    record = result.record
    assert any(s["resampled"] for s in record["steps"])  # the page shows genealogy lines
    page = result.to_html(tmp_path / "run.html")
    data = body_data(chromium(tmp_path, "--dump-dom", page.as_uri() + "#selftest"))
    assert data["errors"] == "0"
    shown = json.loads(data["selftest"])
    last = len(record["steps"])  # frames: the steps, then the final population
    assert shown["before"].startswith("step 1 /") and shown["after"].startswith("final /")
    assert shown["step"] == str(last)
    assert shown["rows"] == len(record["final"]) == 16
    assert shown["lines"] == 16  # every final particle has a parent line
    assert shown["texts"] == frame_texts(record)[-1]  # texts rebuilt from the stored deltas
    steps = [str(s["step"]) for s in record["steps"]]
    assert shown["xticks"][0] == steps[0] and shown["xticks"][-1] == steps[-1]
    assert set(shown["xticks"]) <= set(steps) and len(shown["xticks"]) <= 7
    assert shown["xlabel"] == "step" and shown["legend"] == "resampled"

    png = tmp_path / "shot.png"
    chromium(tmp_path, "--window-size=1000,760", f"--screenshot={png}", page.as_uri() + "#step=3")
    from PIL import Image

    with Image.open(png) as image:
        assert image.size == (1000, 760)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert len(colours) > 50, f"screenshot looks blank: {len(colours)} distinct colours"


@pytest.mark.browser
@needs_chromium
def test_newlines_show_as_a_visible_mark(tmp_path):
    result = tokens_result(["a", "\n", "b", "<eos>"])
    page = result.to_html(tmp_path / "nl.html")
    shown = json.loads(
        body_data(chromium(tmp_path, "--dump-dom", page.as_uri() + "#selftest"))["selftest"]
    )
    final = frame_texts(result.record)[-1]
    assert any("\n" in t for t in final)
    assert shown["texts"] == [t.replace("\n", "\u23ce") for t in final]


@pytest.mark.browser
@needs_chromium
def test_lone_surrogate_token_renders_in_chromium(tmp_path):
    page = tokens_result(["a", "\ud800", "<eos>"]).to_html(tmp_path / "sur.html")
    data = body_data(chromium(tmp_path, "--dump-dom", page.as_uri() + "#selftest"))
    assert data["errors"] == "0"
    assert any("\ufffd" in t for t in json.loads(data["selftest"])["texts"])


@pytest.mark.browser
@needs_chromium
@pytest.mark.parametrize("fragment", ["step=abc", "step=", "step=-1", "step=1e9x"])
def test_bad_step_fragment_is_ignored(tmp_path, fragment):
    page = walk_result().to_html(tmp_path / "run.html")
    data = body_data(chromium(tmp_path, "--dump-dom", page.as_uri() + "#" + fragment))
    assert data["errors"] == "0" and data["step"] == "0"


@pytest.mark.browser
@needs_chromium
def test_all_dead_record_renders_with_its_message(tmp_path):
    result = run(smc_standard(AllFailProgram(toy_lm()), 4, seed=0, record=True))
    page = result.to_html(tmp_path / "dead.html")
    dom = chromium(tmp_path, "--dump-dom", page.as_uri() + "#selftest")
    assert body_data(dom)["errors"] == "0"
    assert "Every particle died" in dom


def test_jupyter_table_keeps_newlines():
    result = tokens_result(["a", "\n", "b", "<eos>"])
    multiline = next(t for t in result.posterior if "\n" in t)
    cells = re.findall(r"<td style='([^']*)'>([^<]*)</td>", result._repr_html_())
    assert any(text == html.escape(multiline) and "pre-wrap" in style for style, text in cells)


def test_jupyter_display_folds_the_viewer_in_only_with_a_record():
    result = walk_result()
    shown = result._repr_html_()
    frame = re.search(r'<iframe srcdoc="([^"]*)"', shown)
    assert "<details>" in shown and html.unescape(frame.group(1)) == render_html(result.record)
    result.record = None
    assert "<iframe" not in result._repr_html_()
