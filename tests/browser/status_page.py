"""The status page in a real browser (headless Chromium through Selenium and Debian's
chromedriver; never Selenium's driver manager, which would download one).

Driven by relay-svc/tests/status_page_browser.rs, which starts the distributed stack with the
selector's status page and talks to this script over stdin/stdout:

1. Without a session the page is the login form and shows no account data.
2. Log in with the admin token; every account's row appears.
3. Print `READY` and wait for `BLOCKED <account id>` on stdin (the test blocks that account
   through the fake upstream meanwhile).
4. Within a refresh (at most --wait seconds, no reload) the account's row shows the hard block,
   its reason and the time left.
5. Write the screenshot and print `SCREENSHOT <path>`.
6. The client keys view lists every key (--keys) with its 24 h usage; its screenshot goes next to
   the first (`-keys.png`).

Exit status 0 when every check held; otherwise the failed check on stderr and 1.
"""

import argparse
import re
import sys
import tempfile

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TIME_LEFT = re.compile(r"^\d+(d \d+h|h \d{2}m|m \d{2}s|s)$")


def fail(message):
    print(f"status page check failed: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def browser(profile, width, height):
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
        f"--window-size={width},{height}",
    ]:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def row_cell(driver, account_id, field):
    cells = driver.find_elements(
        By.CSS_SELECTOR, f'tr[data-account-id="{account_id}"] td[data-field="{field}"]'
    )
    return cells[0].text.strip() if cells else None


def check(args, driver):
    driver.get(args.url + "/")
    if not driver.find_elements(By.CSS_SELECTOR, 'form#login input[name="token"][type="password"]'):
        fail("no login form without a session")
    source = driver.page_source
    for name in args.names:
        if name in source:
            fail(f"account {name!r} shown without a session")
    if driver.find_elements(By.CSS_SELECTOR, "tr[data-account-id]"):
        fail("account rows without a session")

    driver.find_element(By.CSS_SELECTOR, 'form#login input[name="token"]').send_keys(args.token)
    driver.find_element(By.CSS_SELECTOR, 'form#login button[type="submit"]').click()
    try:
        WebDriverWait(driver, args.wait).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-account-id]")) >= len(args.names)
        )
    except TimeoutException:
        fail(f"after the login, fewer than {len(args.names)} account rows within {args.wait} s")
    shown = driver.find_element(By.ID, "accounts").text
    for name in args.names:
        if name not in shown:
            fail(f"account {name!r} missing from the table")
    if not driver.find_element(By.ID, "admission").text.strip():
        fail("admission's state is empty")
    if not driver.find_element(By.ID, "policy").text.strip():
        fail("the failure policy is empty")
    # Survives only if the rows are updated in place: a reload would drop it.
    driver.execute_script("document.body.dataset.kept = 'yes'")

    print("READY", flush=True)
    line = sys.stdin.readline().split()
    if len(line) != 2 or line[0] != "BLOCKED":
        fail(f"expected 'BLOCKED <id>' on stdin, got {line!r}")
    blocked = line[1]

    def shows_the_block(d):
        status = row_cell(d, blocked, "status") or ""
        left = row_cell(d, blocked, "block-left") or ""
        reason = row_cell(d, blocked, "block-reason") or ""
        return status.startswith("hard-blocked") and TIME_LEFT.match(left) and reason

    try:
        WebDriverWait(driver, args.wait, poll_frequency=0.2).until(shows_the_block)
    except TimeoutException:
        fail(
            f"account {blocked}'s row did not show the block within {args.wait} s: status "
            f"{row_cell(driver, blocked, 'status')!r}, reason "
            f"{row_cell(driver, blocked, 'block-reason')!r}, left "
            f"{row_cell(driver, blocked, 'block-left')!r}"
        )
    if driver.execute_script("return document.body.dataset.kept") != "yes":
        fail("the page reloaded instead of updating the table in place")
    print(
        f"ROW status={row_cell(driver, blocked, 'status')!r} "
        f"reason={row_cell(driver, blocked, 'block-reason')!r} "
        f"left={row_cell(driver, blocked, 'block-left')!r}",
        flush=True,
    )
    # Let the rest of the table settle on one refresh before the picture.
    driver.execute_script("window.scrollTo(0, 0)")
    if not driver.save_screenshot(args.screenshot):
        fail(f"cannot write the screenshot {args.screenshot}")
    print(f"SCREENSHOT {args.screenshot}", flush=True)

    driver.find_element(By.ID, "tab-keys").click()
    try:
        WebDriverWait(driver, args.wait, poll_frequency=0.2).until(
            lambda d: all(name in d.find_element(By.ID, "keys").text for name in args.keys)
        )
    except TimeoutException:
        fail(f"the keys view did not list {args.keys} within {args.wait} s")
    if driver.find_element(By.ID, "view-accounts").is_displayed():
        fail("the accounts view still shows with the keys view open")
    keys_shot = re.sub(r"(\.png)?$", "-keys.png", args.screenshot, count=1)
    if not driver.save_screenshot(keys_shot):
        fail(f"cannot write the screenshot {keys_shot}")
    print(f"SCREENSHOT {keys_shot}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the page, http://127.0.0.1:PORT")
    parser.add_argument("--token", required=True, help="the admin token")
    parser.add_argument("--screenshot", required=True, help="where to write the PNG")
    parser.add_argument("--names", nargs="+", required=True, help="every account's name")
    parser.add_argument("--keys", nargs="+", required=True, help="every client key's name")
    parser.add_argument("--wait", type=float, default=10.0, help="seconds to wait for a change")
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=520)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="poolgate-chromium-") as profile:
        driver = browser(profile, args.width, args.height)
        try:
            check(args, driver)
        finally:
            driver.quit()


if __name__ == "__main__":
    main()
