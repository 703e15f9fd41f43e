"""The status page's "Add account" in a real browser (headless Chromium through Selenium and
Debian's chromedriver), against a standalone relay whose page signs in at the test kit's fake
authorization servers (relay-svc/tests/status_page_sign_in.rs starts them):

1. Log in with the admin token.
2. "Add account", Claude, a name: Start shows the sign-in address (the authorization server's,
   with Claude Code's client id) and asks for the code.
3. This script plays the user at the sign-in page: it opens the address without following the
   redirect (the fake signs the user in and redirects to Anthropic's code page) and pastes what
   that page shows, `code#state`.
4. Finish: the page says the account was created, and its row appears in the accounts table
   with its email, without a reload.
5. A second sign-in whose pasted state is not its own is refused on the page, and no account is
   added.

Exit status 0 when every check held; otherwise the failed check on stderr and 1.
"""

import argparse
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def fail(message):
    print(f"add account check failed: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def browser(profile):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1500,1000",
    ]:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def code_page(address):
    """What Anthropic's code page would show for the sign-in at `address`: `code#state`."""
    opener = urllib.request.build_opener(NoRedirect)
    try:
        opener.open(address, timeout=10)
    except urllib.error.HTTPError as error:
        if error.code != 302:
            fail(f"the sign-in page answered {error.code}")
        location = error.headers["Location"]
    else:
        fail("the sign-in page did not redirect")
    query = urllib.parse.parse_qs(urllib.parse.urlparse(location).query)
    return query["code"][0], query["state"][0]


def rows(driver):
    return driver.find_elements(By.CSS_SELECTOR, "tbody#accounts tr[data-account-id]")


def start(driver, name):
    driver.find_element(By.ID, "add-account").click()
    Select(driver.find_element(By.ID, "sign-in-subscription")).select_by_value("claude")
    field = driver.find_element(By.ID, "sign-in-name")
    field.clear()
    field.send_keys(name)
    driver.find_element(By.ID, "sign-in-go").click()
    link = WebDriverWait(driver, 10).until(
        lambda d: d.find_element(By.ID, "sign-in-url")
        if not d.find_element(By.ID, "sign-in-step").get_attribute("hidden")
        else None
    )
    address = link.get_attribute("href")
    if not address.startswith(args.oauth_base + "/cai/oauth/authorize?"):
        fail(f"the sign-in address is not Claude's authorize page: {address}")
    if "client_id=9d1c250a-e61b-44d9-88ed-5944d1962f5e" not in address:
        fail("the sign-in address does not carry Claude Code's client id")
    return address


def finish(driver, pasted):
    field = driver.find_element(By.ID, "sign-in-pasted")
    field.clear()
    field.send_keys(pasted)
    driver.find_element(By.ID, "sign-in-done").click()
    return WebDriverWait(driver, 20).until(
        lambda d: d.find_element(By.ID, "sign-in-result").text.strip() or None
    )


def check(driver):
    driver.get(args.url + "/")
    driver.find_element(By.CSS_SELECTOR, 'form#login input[name="token"]').send_keys(args.token)
    driver.find_element(By.CSS_SELECTOR, 'form#login button[type="submit"]').click()
    WebDriverWait(driver, 20).until(lambda d: len(rows(d)) >= 1)
    before = len(rows(driver))

    # A paste whose state is not this sign-in's: refused, nothing added.
    code, _ = code_page(start(driver, "forged"))
    said = finish(driver, f"{code}#not-this-sign-ins-state")
    if "state" not in said:
        fail(f"a forged state was not refused on the page: {said!r}")

    code, state = code_page(start(driver, args.name))
    said = finish(driver, f"{code}#{state}")
    if not said.startswith("Created account #") or args.name not in said:
        fail(f"the page did not say the account was created: {said!r}")
    if args.email not in said:
        fail(f"the page did not name the account's email: {said!r}")
    try:
        WebDriverWait(driver, 10).until(
            lambda d: any(args.name in row.text for row in rows(d))
        )
    except Exception:
        fail("the new account's row did not appear")
    row = next(row for row in rows(driver) if args.name in row.text)
    if args.email not in row.text:
        fail(f"the new account's row does not show its email: {row.text!r}")
    if len(rows(driver)) != before + 1:
        fail(f"expected {before + 1} rows, found {len(rows(driver))}")
    if args.screenshot:
        driver.save_screenshot(args.screenshot)
    print("CREATED", flush=True)


parser = argparse.ArgumentParser()
parser.add_argument("--url", required=True)
parser.add_argument("--token", required=True)
parser.add_argument("--oauth-base", required=True)
parser.add_argument("--name", required=True)
parser.add_argument("--email", required=True)
parser.add_argument("--screenshot")
args = parser.parse_args()

with tempfile.TemporaryDirectory() as profile:
    driver = browser(profile)
    try:
        check(driver)
    finally:
        driver.quit()
