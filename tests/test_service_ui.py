"""The web UI in real headless Chromium (Playwright with Debian's chromium): log in, submit,
watch progress, open the card, verify it; CSRF and login are enforced."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import requests
from service_fixture import Service, small_inputs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.e2e, pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None,
                                 reason="Debian's chromium is installed by setup.sh")]
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def test_log_in_submit_watch_open_and_verify_in_chromium(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    from certify.api import demo_model_path

    suite, data = small_inputs(tmp_path / "in")
    svc = Service(tmp_path / "home", "--workers", "1", "--dataset", f"small={data}",
                  "--heartbeat", "0.5").start()
    try:
        token = svc.token("submit", "--name", "release-ci")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page()
            # Without a session every page but login and verify leads to the login page.
            page.goto(f"{svc.url}/runs")
            assert page.url.endswith("/login")
            page.fill("#token", "cfy_wrong")
            page.click("button[type=submit]")
            expect(page.locator(".error")).to_contain_text("unknown, revoked or expired")
            page.fill("#token", token)
            page.click("button[type=submit]")
            page.wait_for_url(re.compile(r"/runs$"))
            expect(page.locator(".who")).to_contain_text("release-ci (submit)")
            # Submit the demo model with a small suite and uploaded data.
            page.goto(f"{svc.url}/submit")
            page.set_input_files("#model", str(demo_model_path()))
            page.set_input_files("#suite_file", str(suite))
            page.set_input_files("#dataset_file", str(data))
            page.fill("#samples", "12")
            page.fill("#model_name", "UI sign model")
            page.fill("#model_version", "7")
            page.fill("#intended_use", "Signs seen by a test browser.")
            page.click("form.stack button[type=submit]")
            page.wait_for_url(re.compile(r"/runs/[0-9a-f]{32}$"))
            run_id = page.url.rsplit("/", 1)[1]
            # Live progress until done (the page reloads itself when the run ends).
            expect(page.locator("#state")).to_have_text("done", timeout=120_000)
            expect(page.locator("#verdict")).to_have_text("PASS")
            expect(page.locator("#log-index")).to_be_visible()
            frame = page.frame_locator("iframe.card")
            expect(frame.locator("body")).to_contain_text("clean")
            # the model-card fields of the form are on the card (issue 30)
            expect(frame.locator("header.card-head h1")).to_contain_text("UI sign model")
            expect(frame.locator("#intended-use")).to_contain_text("Signs seen by a test")
            # The runs list shows it with its verdict, and the filters work.
            page.goto(f"{svc.url}/runs?verdict=PASS")
            expect(page.locator(f"a[href='/runs/{run_id}']")).to_be_visible()
            page.goto(f"{svc.url}/runs?verdict=FAIL")
            expect(page.locator("table.runs tbody")).to_contain_text("No runs match")
            # Download the card and verify it on the verify page.
            card = tmp_path / "card.html"
            card.write_bytes(svc.get(f"/runs/{run_id}/card.html", token).content)
            page.goto(f"{svc.url}/verify")
            page.set_input_files("#file", str(card))
            page.click("form.stack button[type=submit]")
            expect(page.locator("#result")).to_contain_text("VALID")
            log_index = svc.get(f"/runs/{run_id}", token).json()["log_index"]
            expect(page.locator("#result #log-index")).to_have_text(str(log_index))
            # A tampered card is invalid.
            bad = tmp_path / "bad.html"
            bad.write_text(card.read_text().replace('"PASS"', '"FAIL"', 1))
            page.set_input_files("#file", str(bad))
            page.click("form.stack button[type=submit]")
            expect(page.locator("#result")).to_contain_text("INVALID")
            # The API's page renders offline (Swagger UI shipped, not fetched from a CDN).
            page.goto(f"{svc.url}/docs")
            expect(page.get_by_role("heading", level=1)).to_contain_text("certify service",
                                                                     timeout=20_000)
            expect(page.locator("body")).to_contain_text("/api/v1/runs")
            browser.close()
        # A POST without the session's CSRF token is refused.
        s = requests.Session()
        s.post(f"{svc.url}/login", data={"token": token})
        r = s.post(f"{svc.url}/logout", data={"csrf": "forged"})
        assert r.status_code == 403
    finally:
        svc.stop()
