// Package browser holds the console's browser tests: they drive a real
// Chromium through the console's pages against a real PostgreSQL. It is a
// module of its own so the library never depends on a browser driver.
//
// The tests skip when Chromium is not installed (Debian package chromium;
// $CHROMIUM names another binary) unless $OUTBOX_REQUIRE_BROWSER is set,
// and write a screenshot of each step to $CONSOLE_SCREENSHOTS when set.
package browser
