"""The documentation site builds with warnings as errors, its internal links resolve, and its pages render in a real
browser (headless Chromium: title, code blocks, images loaded, no console errors)."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.slow  # a full Sphinx build: 15-30 s on 2 CPU cores


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the site once, like CI and the README command do: ``sphinx-build -W --keep-going -b html``."""
    pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("docs")
    cmd = [
        sys.executable,
        "-m",
        "sphinx",
        "-W",
        "--keep-going",
        "-q",
        "-b",
        "html",
        "-d",
        str(out / "doctrees"),
        str(DOCS),
        str(out / "html"),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"sphinx-build -W failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return out / "html"


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key == "id" and value:
                self.ids.add(value)
            if tag == "a" and key == "name" and value:
                self.ids.add(value)
            if value and ((key == "href" and tag in ("a", "link")) or (key == "src" and tag in ("img", "script"))):
                self.links.append(value)


@functools.cache
def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def test_docs_build_has_every_page(site: Path) -> None:
    import lightning_speedups as ls

    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"notebooks/{nb.stem}.html" in pages, f"notebook {nb.name} is not rendered"
    for must in (
        "index.html",
        "trainer_settings.html",
        "tested_architectures.html",
        "bench.html",
        "api.html",
        "evidence.html",
        "autotune.html",
    ):
        assert must in pages
    api = (site / "api.html").read_text(encoding="utf-8")
    missing = [n for n in ls.__all__ if f'title="lightning_speedups.{n}"' not in api and f">{n}<" not in api]
    assert not missing, f"public names missing from the API table: {missing}"


def test_docs_internal_links_resolve(site: Path) -> None:
    broken = []
    for page in sorted(site.rglob("*.html")):
        for link in _parse(page).links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "data:", "javascript:")):
                continue  # external: the site itself loads nothing from the network (checked in the browser)
            target = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            rel = page.relative_to(site)
            if not target.exists():
                broken.append(f"{rel}: {link} (no such file)")
            elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in _parse(target).ids:
                broken.append(f"{rel}: {link} (no anchor #{parts.fragment})")
    assert not broken, "broken internal links:\n" + "\n".join(broken[:50])


# ---------------------------------------------------------------- browser


def _notebook_with_most_images() -> tuple[str, int]:
    """The notebook page to open: the one with the most stored image outputs (ties: the first)."""
    best = ("03_pruning", 0)
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        images = sum(
            1 for c in cells for o in c.get("outputs", []) if any(k.startswith("image/") for k in o.get("data", {}))
        )
        if images > best[1]:
            best = (nb.stem, images)
    return best


@pytest.fixture(scope="module")
def server(site: Path):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # keep pytest's output clean
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("Chromium or chromedriver not found: apt-get install -y chromium chromium-driver (Debian)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed: pip install -e '.[docs]'")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,1600",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    os.environ.setdefault("SE_AVOID_STATS", "true")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


_IMAGES_JS = """
const imgs = Array.from(document.images);
return imgs.map(i => ({src: i.currentSrc || i.src, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight}));
"""


def _open(driver, url: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")
    driver.execute_script("for (const i of document.images) { i.loading = 'eager'; i.scrollIntoView(); }")
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return Array.from(document.images).every(i => i.complete)")
    )


def _pages() -> list[tuple[str, str, int]]:
    stem, images = _notebook_with_most_images()
    title = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))["cells"][0]["source"]
    title = "".join(title).splitlines()[0].lstrip("# ").strip()
    return [
        ("index.html", "lightning-speedups", 1),
        ("techniques/pruning.html", "Pruning", 1),
        (f"notebooks/{stem}.html", title, images),
    ]


@pytest.mark.parametrize("page, title, min_images", _pages(), ids=lambda v: str(v).split("/")[-1][:30])
def test_docs_page_renders_in_chromium(server: str, browser, page: str, title: str, min_images: int) -> None:
    from selenium.webdriver.common.by import By

    browser.get_log("browser")  # drop what earlier pages logged
    _open(browser, f"{server}/{page}")
    h1 = browser.find_element(By.CSS_SELECTOR, "article h1")
    assert h1.is_displayed() and title in h1.text, f"{page}: h1 is {h1.text!r}, expected {title!r}"
    assert title in browser.title, f"{page}: <title> is {browser.title!r}"
    code = [e for e in browser.find_elements(By.CSS_SELECTOR, "article div.highlight pre") if e.is_displayed()]
    assert code and all(e.text.strip() for e in code), f"{page}: no visible, non-empty code block"
    images = browser.execute_script(_IMAGES_JS)
    assert len(images) >= min_images, f"{page}: {len(images)} image(s), expected at least {min_images}"
    bad = [i for i in images if not (i["complete"] and i["w"] > 0 and i["h"] > 0)]
    assert not bad, f"{page}: images that did not load: {bad}"
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, f"{page}: console errors: {errors}"


# ---------------------------------------------------------------- notebook executor (tools/execute_notebooks.py)


def _notebook(path: Path, *sources: str) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# A title"), *(nbformat.v4.new_code_cell(s) for s in sources)]
    nbformat.write(nb, path)
    return path


def test_execute_notebooks_writes_outputs_and_stamp(tmp_path: Path) -> None:
    pytest.importorskip("nbclient")
    from tools.execute_notebooks import STAMP_TAG, main

    path = _notebook(tmp_path / "ok.ipynb", "print(6 * 7)")
    assert main([str(path)]) == 0
    assert main([str(path)]) == 0  # re-running replaces the stamp, it does not add a second one
    nb = json.loads(path.read_text())
    stamps = [c for c in nb["cells"] if STAMP_TAG in c["metadata"].get("tags", [])]
    assert len(stamps) == 1 and nb["cells"][1] is stamps[0]  # right after the title
    assert "torch threads" in "".join(stamps[0]["source"])
    assert "42" in "".join(nb["cells"][2]["outputs"][0]["text"])
    assert nb["metadata"]["lightning_speedups"]["executed_on"]["torch"]


def test_execute_notebooks_names_the_failing_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("nbclient")
    from tools.execute_notebooks import main

    bad = _notebook(tmp_path / "bad.ipynb", "x = 1", "1 / 0")
    before = bad.read_bytes()
    assert main([str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.ipynb: cell 2 (1 / 0) failed: ZeroDivisionError: division by zero" in err
    assert bad.read_bytes() == before  # stored outputs are never half-updated


def test_readme_links_every_notebook_and_the_site() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Documentation" in readme and "sphinx-build -W" in readme
    missing = [nb.name for nb in sorted((ROOT / "notebooks").glob("*.ipynb")) if f"(notebooks/{nb.name})" not in readme]
    assert not missing, f"README.md does not link these notebooks: {missing}"
