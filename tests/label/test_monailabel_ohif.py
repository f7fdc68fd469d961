"""OHIF in a real browser against the app on a real PACS (docs/monailabel.md, "OHIF").

One end-to-end test drives the OHIF build that MONAI Label 0.8.5 ships (3.10.0-beta.5, served at ``/ohif/``) in
headless Chromium (Debian's ``chromium`` and ``chromium-driver``, through selenium), as a radiologist would:

1. the study list shows both patients of the PACS (Orthanc on loopback, ``tests/label/pacs.py``); typed into the
   MRN filter, ``PAT-A`` lists that patient's study only (OHIF sends ``00100020=*PAT-A*`` through the server's QIDO
   proxy: the filter reaches Orthanc);
2. the study opens in the ``monai-label`` mode: the series is loaded in the three viewports, and the Studies panel
   lists the open patient's study only;
3. the MONAI Label panel's server field shows its default ``http://127.0.0.1:8000/``; the test types the server's URL
   and clicks the refresh button: the panel connects (the app's name shown) and OHIF's segmentation service holds one
   labelmap whose segments are the model's eight organs, all empty;
4. Auto-Segmentation's Run: the browser's own network log shows ``POST /infer/<model>?image=<PAT-A's series>``
   answered 200, OHIF says "Running Segmentation - Successful", its labelmap holds, organ by organ, exactly the voxels
   of the server's answer to the same request (asked again here), and the overlay is drawn: coloured pixels appear
   in each of the three viewports, where there were none before.

A screenshot is written at each step into the test's temporary folder (kept when the test fails; its path is printed
then, with the page's HTML and the browser's console). The network is a tiny random SpectraFlowNet (as in
``test_monailabel_dicomweb.py``): the overlay shows whatever it segments, the test checks that OHIF shows exactly the
server's answer. Chromium resolves no host name but loopback (nothing leaves the machine). Every wait has a deadline.

Skipped, with the reason, where MONAI Label, selenium, Chromium, chromedriver or Orthanc is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("monailabel", reason="MONAI Label is not installed (docs/monailabel.md)")
requests = pytest.importorskip("requests")
pytest.importorskip("selenium", reason="selenium is not installed (the test extra: pip install -e '.[test]')")

from .pacs import requires_orthanc, running_orthanc  # noqa: E402
from .test_monailabel_app import NAME_3D, ORGANS, _make_bundles, running_server  # noqa: E402
from .test_monailabel_dicomweb import CONF, _offline_env  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = "/usr/bin/chromedriver"
requires_chromium = pytest.mark.skipif(
    CHROMIUM is None or not os.path.isfile(CHROMEDRIVER),
    reason="Chromium or its driver is not installed (apt-get install --no-install-recommends chromium "
    "chromium-driver; .ci/run does)",
)
pytestmark = [requires_orthanc, requires_chromium, pytest.mark.slow]

#: seconds for one browser step (a page, a panel, an inference); one WebDriver command is bounded by selenium's
#: Chromium connection (120 s since selenium 4.28)
STEP_TIMEOUT = 45.0
#: what MONAI Label's OHIF client sends with an inference (its ``infer``: a raw NRRD of class values)
OHIF_INFER_PARAMS = {"result_extension": ".nrrd", "result_dtype": "uint8", "result_compress": False,
                     "restore_label_idx": False}  # fmt: skip
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",  # a container's small /dev/shm
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # only loopback (OHIF's web font request fails)
    "--window-size=1600,1000",
)  # fmt: skip

# In the page: per viewport canvas, its size, its coloured pixels (a grey CT has none: the labelmap's colours) and
# its lit pixels; OHIF's segmentations (id, segment index -> label) and the histogram of labelmap '1' (index -> voxels).
_PROBE = """
const out = {canvases: [], segmentations: [], histogram: null};
for (const canvas of document.querySelectorAll('canvas.cornerstone-canvas')) {
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let coloured = 0, lit = 0;
  for (let i = 0; i < data.length; i += 4) {
    const high = Math.max(data[i], data[i + 1], data[i + 2]), low = Math.min(data[i], data[i + 1], data[i + 2]);
    if (high - low > 40) coloured++;
    if (high > 20) lit++;
  }
  out.canvases.push({width: canvas.width, height: canvas.height, coloured: coloured, lit: lit});
}
const service = window.services && window.services.segmentationService;
if (service) {
  for (const seg of service.getSegmentations()) {
    const segments = {};
    for (const s of Object.values(seg.segments || {})) { if (s) segments[s.segmentIndex] = s.label; }
    out.segmentations.push({id: seg.segmentationId, segments: segments});
  }
  const volume = out.segmentations.length ? service.getLabelmapVolume('1') : null;
  if (volume) {
    const histogram = {};
    for (const v of volume.voxelManager.getCompleteScalarDataArray()) { if (v) histogram[v] = (histogram[v] || 0) + 1; }
    out.histogram = histogram;
  }
}
return out;
"""


class _Browser:
    """Headless Chromium driven through Debian's chromedriver, with a screenshot per step into ``shots``."""

    def __init__(self, folder: Path):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.shots = folder / "screenshots"
        self.shots.mkdir(parents=True)
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in CHROMIUM_FLAGS + (f"--user-data-dir={folder / 'profile'}",):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER, log_output=str(folder / "chromedriver.log")),
                                       options=options)  # fmt: skip
        self.driver.set_page_load_timeout(STEP_TIMEOUT)
        self.driver.set_script_timeout(STEP_TIMEOUT)
        self.console: list[dict] = []
        self.network: list[dict] = []
        self.steps = 0

    def shot(self, name: str) -> None:
        self.steps += 1
        self.driver.save_screenshot(str(self.shots / f"{self.steps:02d}_{name}.png"))

    def wait(self, what: str, condition, timeout: float = STEP_TIMEOUT):
        """``condition(driver)`` until it is truthy (returned), for at most ``timeout`` seconds."""
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout, poll_frequency=0.25, ignored_exceptions=(
            StaleElementReferenceException,)).until(condition, f"{what} (after {timeout} s)")  # fmt: skip

    def css(self, selector: str) -> list:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def probe(self) -> dict:
        return self.driver.execute_script(_PROBE)

    def responses(self) -> list[dict]:
        """The HTTP responses the page received so far (``Network.responseReceived``: url, status)."""
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.responseReceived":
                response = message["params"]["response"]
                self.network.append({"url": response["url"], "status": response["status"]})
        return self.network

    def keep_evidence(self) -> None:
        """The page's HTML and the browser's console beside the screenshots."""
        (self.shots / "page.html").write_text(self.driver.page_source)
        self.console += self.driver.get_log("browser")
        (self.shots / "console.json").write_text(json.dumps(self.console, indent=1))

    def quit(self) -> None:
        self.driver.quit()


def _rows(browser: _Browser) -> list[str]:
    """The study instance UIDs of the study list's rows."""
    return [row.get_attribute("data-cy")[len("studyRow-") :] for row in browser.css('tr[data-cy^="studyRow-"]')]


def _served_answer(base: str, series_uid: str, tmp: Path) -> dict[str, int]:
    """The server's answer to OHIF's inference request, asked again: voxels per organ name."""
    import SimpleITK as sitk

    r = requests.post(f"{base}/infer/{NAME_3D}", params={"image": series_uid, "output": "image"},
                      files={"params": (None, json.dumps(OHIF_INFER_PARAMS))}, timeout=300)  # fmt: skip
    assert r.status_code == 200, r.text[:500]
    (tmp / "answer.nrrd").write_bytes(r.content)
    values, counts = np.unique(sitk.GetArrayFromImage(sitk.ReadImage(str(tmp / "answer.nrrd"))), return_counts=True)
    names = {v: k for k, v in ORGANS.items()}
    return {names[int(v)]: int(c) for v, c in zip(values, counts) if v}


def _probe_when(browser: _Browser, accept) -> dict | None:
    """The page's :data:`_PROBE` when ``accept(probe)`` holds, else None (for :meth:`_Browser.wait`)."""
    probe = browser.probe()
    return probe if accept(probe) else None


def _drive_ohif(browser: _Browser, base: str, pacs) -> None:
    from selenium.webdriver.common.keys import Keys

    series = pacs.series["PAT-A"]
    studies = {s.study_uid for s in pacs.series.values()}
    organs = sorted(ORGANS)

    # 1. the study list: both patients; filtered by MRN, one
    browser.driver.get(f"{base}/ohif/")
    browser.wait("the study list lists both patients' studies", lambda d: set(_rows(browser)) == studies)
    assert browser.css('[data-cy="num-studies"]')[0].text == "2"
    for button in browser.css('[data-cy="confirm-and-hide-button"]'):  # "for investigational use only"
        button.click()
    browser.shot("study_list")
    browser.css('[data-cy="input-mrn"]')[0].send_keys("PAT-A")
    browser.wait("the MRN filter lists PAT-A's study only", lambda d: _rows(browser) == [series.study_uid])
    browser.wait("the count says 1", lambda d: browser.css('[data-cy="num-studies"]')[0].text == "1")
    browser.shot("study_list_filtered")

    # 2. the series in the MONAI Label mode
    browser.css(f'tr[data-cy="studyRow-{series.study_uid}"]')[0].click()
    mode = f'button[data-cy="mode-monai-label-{series.study_uid}"]'
    browser.wait("the study's MONAI Label mode button", lambda d: browser.css(mode))[0].click()
    browser.wait("the viewer on the study", lambda d: f"StudyInstanceUIDs={series.study_uid}" in d.current_url)
    slices = f"/{len(series.files)})"  # the axial viewport's "I:7 (7/12)"
    browser.wait("the series' slices in the axial viewport", lambda d: any(
        slices in e.text for e in browser.css('[data-cy="viewport-overlay-bottom-right"]')))  # fmt: skip
    before = browser.wait("the three viewports drawn", lambda d: _probe_when(
        browser, lambda p: len(p["canvases"]) == 3 and all(c["lit"] for c in p["canvases"])))  # fmt: skip
    assert before["segmentations"] == [] and all(c["coloured"] == 0 for c in before["canvases"]), before
    panel = browser.wait("the Studies panel", lambda d: browser.css('[data-cy="studyBrowser-panel"]'))[0]
    assert len(browser.css('[data-cy="studyBrowser-panel"] h3')) == 1, panel.text  # the open patient's study only
    assert len(browser.css('[data-cy="study-browser-thumbnail"]')) == 1, panel.text  # its one series
    browser.shot("viewer")

    # 3. the MONAI Label panel: its default server, then this server's URL and its refresh button
    field = browser.wait("the MONAI Label panel's server field", lambda d: browser.css("#monailabelServerURL"))[0]
    assert field.get_attribute("value") == "http://127.0.0.1:8000/", field.get_attribute("value")
    field.click()
    field.send_keys(Keys.CONTROL, "a")  # (not cleared: this panel fails on an empty field, it parses "" as a URL)
    field.send_keys(f"{base}/")
    browser.css(".monaiLabelPanel .settingsTable button.actionButton")[0].click()
    name = requests.get(f"{base}/info/", timeout=60).json()["name"]
    browser.wait("the panel connected (the app's name)", lambda d: [
        e for e in browser.css(".monaiLabelPanel .subtitle") if e.text == name])  # fmt: skip

    def organs_listed(probe: dict) -> bool:
        return bool(probe["segmentations"]) and sorted(probe["segmentations"][0]["segments"].values()) == organs

    connected = browser.wait("OHIF's labelmap with the model's organs", lambda d: _probe_when(browser, organs_listed))
    assert connected["histogram"] == {}, connected["histogram"]  # empty until the model runs
    browser.shot("panel_connected")

    # 4. Auto-Segmentation
    run = '.monaiLabelPanel button[title="Run Segmentation"]'
    browser.wait("the Run button", lambda d: [b for b in browser.css(run) if b.is_displayed()])[0].click()
    browser.wait("OHIF's success message", lambda d: "Running Segmentation - Successful" in d.page_source)
    after = browser.wait("the labelmap filled", lambda d: _probe_when(browser, lambda p: p["histogram"]))
    infer = [r for r in browser.responses() if f"/infer/{NAME_3D}?" in r["url"]]
    assert [r["status"] for r in infer] == [200], infer
    assert f"image={series.series_uid}" in infer[0]["url"], infer
    segments = after["segmentations"][0]["segments"]
    shown = {segments[index]: count for index, count in after["histogram"].items()}
    assert shown == _served_answer(base, series.series_uid, browser.shots.parent), shown
    drawn = browser.wait("the overlay drawn in the three viewports", lambda d: _probe_when(
        browser, lambda p: all(c["coloured"] for c in p["canvases"])))  # fmt: skip
    browser.shot("segmented")
    print("overlay:", shown, "coloured pixels per viewport:", [c["coloured"] for c in drawn["canvases"]])


def test_ohif_lists_one_patient_opens_the_series_and_overlays_the_model(tmp_path):
    started = time.monotonic()
    with running_orthanc(tmp_path / "orthanc") as pacs:
        bundles = _make_bundles(tmp_path, tmp_path, names=(NAME_3D,))
        with running_server(tmp_path, pacs.dicomweb, bundles, CONF, env=_offline_env(tmp_path)) as (base, log):
            browser = _Browser(tmp_path / "browser")
            try:
                _drive_ohif(browser, base, pacs)
            except BaseException:
                try:
                    browser.shot("failed")
                    browser.keep_evidence()
                finally:
                    print(f"screenshots, page and console: {browser.shots}\nserver log: {log}")
                raise
            finally:
                browser.quit()
            assert f"'image': '{pacs.series['PAT-A'].series_uid}'" in log.read_text()  # the request reached the server
    print(f"browser test: {time.monotonic() - started:.1f} s")
