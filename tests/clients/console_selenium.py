"""The operator console in a real browser: Debian's Chromium driven by Selenium through
chromedriver (nothing downloaded), against a `capstan serve` the Rust test started.

    console_selenium.py BASE OPS_KEY HELLO_ONLY_KEY SCREENSHOT_DIR HOOK_URL

Scenario: sign in; an onboard-domain triggered through the API appears in the list and its
stages reach `succeeded` without a page load; an add-subdomain plan is approved from the page;
a waiting execution is canceled from the page; the node's workflows, the event catalog and the
audit log are shown; a failed webhook delivery (HOOK_URL answers nothing) is sent again from the
page; a key without the workflow's permission sees the 403 explained. Screenshots at 1280x800 and at phone width land in SCREENSHOT_DIR. Exits non-zero
(with the reason) on the first expectation that fails.
"""

import json
import os
import sys
import time
import urllib.request
import uuid

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

BASE, OPS_KEY, LIMITED_KEY, SHOTS, HOOK = sys.argv[1:6]
TIMEOUT = 60


def api(method, path, key, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(BASE + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {key}")
    if body is not None:
        request.add_header("Content-Type", "application/json")
        request.add_header("Idempotency-Key", str(uuid.uuid4()))
    with urllib.request.urlopen(request) as answer:
        return json.loads(answer.read() or b"null")


def browser():
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,800"):
        options.add_argument(flag)
    binary = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if os.path.exists(p)), None)
    if binary:
        options.binary_location = binary
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def shot(driver, name):
    driver.save_screenshot(os.path.join(SHOTS, f"{name}.png"))


def until(driver, condition, what):
    try:
        return WebDriverWait(driver, TIMEOUT, poll_frequency=0.2).until(condition)
    except Exception as e:
        shot(driver, "failure")
        raise SystemExit(f"{type(e).__name__}: "
                         f"timed out waiting for {what}; page text:\n{driver.find_element(By.TAG_NAME, 'body').text}")


def click(driver, selector, what):
    # Live lists are rebuilt whenever they change; a row found in one WebDriver call may be
    # gone by the next, so find and click are retried together.
    def press(d):
        try:
            d.find_element(By.CSS_SELECTOR, selector).click()
            return True
        except (StaleElementReferenceException, NoSuchElementException):
            return False
    until(driver, press, what)


def sign_in(driver, key):
    driver.get(BASE + "/console/")
    field = until(driver, ec.presence_of_element_located((By.ID, "api-key")), "the sign-in form")
    field.send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "#signin button[type=submit]").click()
    until(driver, ec.presence_of_element_located((By.ID, "filters")), "the executions list")


def statuses(driver, selector):
    # Read in one script: live updates replace the elements between two WebDriver calls.
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.dataset.status)", selector)


def main():
    os.makedirs(SHOTS, exist_ok=True)
    driver = browser()
    try:
        sign_in(driver, OPS_KEY)
        if "capstan.apiKey" in driver.current_url or OPS_KEY in driver.current_url:
            raise SystemExit("the key is in the URL")
        # Set after the page loaded: a reload would drop it.
        driver.execute_script("window.__sameDocument = true;")
        until(driver, lambda d: "on" in d.find_element(By.ID, "live").get_attribute("class"), "the live stream")

        # onboard-domain, triggered through the API, appears and finishes without a reload.
        onboard = api("POST", "/v1/workflows/onboard-domain", OPS_KEY,
                      {"domain": "console.test", "ticketId": "OPS-1"})["executionId"]
        row = f'tr[data-execution="{onboard}"]'
        until(driver, ec.presence_of_element_located((By.CSS_SELECTOR, row)), "the new execution in the list")
        shot(driver, "executions")
        click(driver, f"{row} a", "the new execution's link")
        until(driver, ec.presence_of_element_located((By.ID, "stages")), "the stage timeline")
        running = statuses(driver, "#stages .status")
        until(driver, lambda d: statuses(d, "h1 .status") == ["succeeded"]
              and len(statuses(d, "#stages .status")) >= 9
              and set(statuses(d, "#stages .status")) == {"succeeded"}, "every stage succeeded")
        until(driver, ec.presence_of_element_located((By.ID, "outcome")), "the outcome card")
        if not driver.execute_script("return window.__sameDocument === true"):
            raise SystemExit("the page was reloaded")
        if set(running) == {"succeeded"} and len(running) >= 9:
            raise SystemExit("the execution had finished before the page showed it: nothing was watched live")
        until(driver, ec.presence_of_element_located((By.CSS_SELECTOR, '#receipts tr[data-op="cdn.create-distribution"]')),
              "the receipts")
        outcome = driver.find_element(By.ID, "outcome").text
        for expected in ("console.test", "Certificate", "Proxy distribution", "OPS-1"):
            if expected not in outcome:
                raise SystemExit(f"the outcome card does not show {expected!r}:\n{outcome}")
        shot(driver, "onboard-domain")
        driver.set_window_size(390, 844)
        shot(driver, "onboard-domain-phone")
        driver.set_window_size(1280, 800)

        # add-subdomain: the plan as a table, approved from the page.
        apex = {"dnsName": "dapex.cdn.sim.capstan.dev", "hostedZoneId": "ZCDNSIMULATED",
                "evaluateTargetHealth": False}
        plan_run = api("POST", "/v1/workflows/add-subdomain", OPS_KEY,
                       {"rootDomain": "example.com", "subdomains": ["www", "api"], "apexAlias": apex})["executionId"]
        driver.get(f"{BASE}/console/#/executions/{plan_run}")
        until(driver, ec.element_to_be_clickable((By.ID, "approve-plan")), "the plan's approve button")
        plan = driver.find_element(By.ID, "plan").text
        if "www.example.com" not in plan or "api.example.com" not in plan:
            raise SystemExit(f"the plan table misses a hostname:\n{plan}")
        shot(driver, "add-subdomain-plan")
        driver.find_element(By.ID, "approve-plan").click()
        until(driver, ec.alert_is_present(), "the confirmation")
        driver.switch_to.alert.accept()
        until(driver, lambda d: statuses(d, "h1 .status") == ["succeeded"], "the approved plan applied")
        applied = api("GET", f"/v1/executions/{plan_run}", OPS_KEY)
        if applied["status"] != "succeeded":
            raise SystemExit(f"add-subdomain is {applied['status']} after approval")

        # A waiting execution canceled from the page.
        waiting = api("POST", "/v1/workflows/hello", OPS_KEY, {"name": "Ada", "pauseSeconds": 600})["executionId"]
        driver.get(f"{BASE}/console/#/executions/{waiting}")
        until(driver, lambda d: statuses(d, "h1 .status") == ["waiting"], "the execution waiting")
        driver.find_element(By.CSS_SELECTOR, 'button[data-action="cancel"]').click()
        until(driver, ec.alert_is_present(), "the confirmation")
        driver.switch_to.alert.accept()
        until(driver, lambda d: statuses(d, "h1 .status") == ["canceled"], "the execution canceled")
        if driver.find_elements(By.CSS_SELECTOR, 'button[data-action="cancel"]'):
            raise SystemExit("cancel is still offered on a canceled execution")
        shot(driver, "canceled")

        # The node's workflows and providers, the event catalog, the audit log.
        driver.get(f"{BASE}/console/#/workflows")
        until(driver, ec.presence_of_element_located((By.CSS_SELECTOR, 'tr[data-workflow="onboard-domain"]')),
              "the loaded workflows")
        row = driver.find_element(By.CSS_SELECTOR, 'tr[data-workflow="onboard-domain"]').text
        if "readiness → registration" not in row or "maps (simulated)" not in row:
            raise SystemExit(f"the workflow row lacks its stages or capabilities:\n{row}")
        shot(driver, "workflows")
        driver.get(f"{BASE}/console/#/events")
        until(driver, lambda d: "ExecutionSucceeded.v1" in d.find_element(By.TAG_NAME, "main").text, "the event catalog")
        driver.get(f"{BASE}/console/#/audit")
        until(driver, lambda d: "approve" in d.find_element(By.TAG_NAME, "main").text.lower()
              or "workflows:add-subdomain" in d.find_element(By.TAG_NAME, "main").text, "the audit log")

        # A subscription whose receiver does not answer: its delivery fails and is sent again
        # from the page.
        sub = api("POST", "/v1/subscriptions", OPS_KEY, {
            "events": ["ExecutionSucceeded.v1"], "url": HOOK,
            "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})["subscription"]["id"]
        api("POST", "/v1/workflows/hello", OPS_KEY, {"name": "Grace"})
        driver.get(f"{BASE}/console/#/subscriptions")
        until(driver, lambda d: HOOK in d.find_element(By.TAG_NAME, "main").text, "the subscription listed")
        # Until the retries are used up: a redelivery asked while an attempt is still pending
        # is that attempt (nothing new to count).
        deadline = time.time() + TIMEOUT
        while not any(d["status"] == "exhausted"
                      for d in api("GET", f"/v1/subscriptions/{sub}/deliveries", OPS_KEY)["deliveries"]):
            if time.time() > deadline:
                raise SystemExit("the delivery's attempts were not used up")
            time.sleep(0.2)
        driver.get(f"{BASE}/console/#/subscriptions/{sub}")
        until(driver, ec.presence_of_element_located((By.CSS_SELECTOR, "#deliveries tbody tr")), "a delivery")
        before = len(api("GET", f"/v1/subscriptions/{sub}/deliveries", OPS_KEY)["deliveries"])
        click(driver, "#deliveries tbody tr button", "the redeliver button")
        until(driver, ec.alert_is_present(), "the confirmation")
        driver.switch_to.alert.accept()
        until(driver, lambda d: len(api("GET", f"/v1/subscriptions/{sub}/deliveries", OPS_KEY)["deliveries"]) > before,
              "the redelivery")
        shot(driver, "deliveries")

        # A key without the workflow's permission: the 403 explained.
        driver.find_element(By.ID, "sign-out").click()
        sign_in(driver, LIMITED_KEY)
        driver.get(f"{BASE}/console/#/executions/{onboard}")
        error = until(driver, ec.presence_of_element_located((By.CSS_SELECTOR, ".error")), "the refusal")
        text = error.text
        if "403 forbidden" not in text or "workflows:onboard-domain" not in text or "principals grant" not in text:
            raise SystemExit(f"the 403 is not explained:\n{text}")
        shot(driver, "forbidden")
    finally:
        driver.quit()
    print("console scenario passed")


if __name__ == "__main__":
    main()
