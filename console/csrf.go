package console

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// How an action's form proves that it came from the console's own page.
//
// Three checks, each covering what the others cannot:
//
//   - The Host rule (hosts.go) refuses a request for a name the console
//     does not answer: a page that got the browser to resolve its own
//     name to the console (DNS rebinding) is same-origin with the console
//     in the browser's eyes, so neither the browser's headers nor the
//     token below can tell it apart.
//   - The browser's own account of where a request came from:
//     http.CrossOriginProtection (Sec-Fetch-Site, else Origin against
//     Host), and beyond it an Origin that is present must be the request's
//     own Host even when Sec-Fetch-Site says same-origin, and "null" (a
//     sandboxed frame, a file, a cross-origin redirect) is refused. It
//     costs nothing and is the defence browsers maintain; but it passes a
//     request that carries neither header (an older browser, a proxy that
//     drops them), and Chromium sends Sec-Fetch-Site only to https and
//     loopback origins.
//   - A token that the console made: the form repeats the cookie's value,
//     and the value carries an HMAC under a key each Console draws at
//     New. Cookies do not keep to a port, so a page on another port of the
//     same name can plant a cookie; a value the console did not sign (or
//     another process signed) is refused, and it does not depend on what
//     the browser says.

// csrfCookie names the cookie that holds the token every action's form
// must repeat.
const csrfCookie = "outboxgen_console_csrf"

// Sizes of a token: a random nonce and its HMAC-SHA256.
const (
	tokenNonce = 16
	tokenMAC   = sha256.Size
)

// tokenContext separates the console's token MACs from any other use of
// the key.
const tokenContext = "outboxgen console form token v1\x00"

// TokenKeyMinSize is the fewest bytes [Config.TokenKey] may hold.
const TokenKeyMinSize = 32

// newTokenKey draws the key of a console's tokens.
func newTokenKey() []byte {
	k := make([]byte, TokenKeyMinSize)
	_, _ = rand.Read(k) // never fails (crypto/rand)
	return k
}

func (c *Console) tokenMAC(nonce []byte) []byte {
	m := hmac.New(sha256.New, c.tokenKey)
	m.Write([]byte(tokenContext))
	m.Write(nonce)
	return m.Sum(nil)
}

// newToken returns a fresh token signed with the console's key.
func (c *Console) newToken() string {
	b := make([]byte, tokenNonce, tokenNonce+tokenMAC)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(append(b, c.tokenMAC(b)...))
}

// validToken reports whether tok is a token this console made.
func (c *Console) validToken(tok string) bool {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) != tokenNonce+tokenMAC {
		return false
	}
	return hmac.Equal(b[tokenNonce:], c.tokenMAC(b[:tokenNonce]))
}

// csrfToken returns the request's token, setting a new one when it
// carries none the console made. A request may carry several cookies of
// the name (one planted with a narrower path comes first): the first
// valid one is kept.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	for _, ck := range r.CookiesNamed(csrfCookie) {
		if c.validToken(ck.Value) {
			return ck.Value
		}
	}
	tok := c.newToken()
	http.SetCookie(w, &http.Cookie{
		Name: csrfCookie, Value: tok, Path: cmp.Or(c.cfg.Path, "/"),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	return tok
}

// errStaleToken is the refusal of a form whose token the console did not
// make, or that does not match the cookie.
var errStaleToken = errors.New("this form did not come from this console's page (its token is missing, stale, " +
	"or from another console): reload the page and try again")

// checkToken refuses a form whose token is not one of this console's,
// repeated from the request's cookie.
func (c *Console) checkToken(r *http.Request) error {
	tok := r.PostForm.Get("csrf")
	if tok == "" || !c.validToken(tok) {
		return errStaleToken
	}
	for _, ck := range r.CookiesNamed(csrfCookie) {
		if subtle.ConstantTimeCompare([]byte(ck.Value), []byte(tok)) == 1 {
			return nil
		}
	}
	return errStaleToken
}

// safeMethod reports whether a request of method m only reads.
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// checkOrigin refuses a request that changes something (anything but
// GET, HEAD, OPTIONS) when the browser says it came from elsewhere.
func (c *Console) checkOrigin(r *http.Request) error {
	if safeMethod(r.Method) {
		return nil
	}
	origin := r.Header.Get("Origin")
	if origin == "null" {
		return errors.New("refusing a request from an opaque origin (Origin: null: a sandboxed frame, a file, or a redirect from another site): " +
			"send the console's forms from its own pages")
	}
	if err := c.crossOrigin.Check(r); err != nil {
		if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
			return fmt.Errorf("refusing a request sent from another site or origin (Sec-Fetch-Site: %s)", clip(site, maxLogged))
		}
		return fmt.Errorf("refusing a request sent from another origin (Origin: %s, Host: %s)", clip(origin, maxLogged), clip(r.Host, maxLogged))
	}
	if origin != "" {
		u, err := url.Parse(origin)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || !strings.EqualFold(u.Host, r.Host) {
			return fmt.Errorf("refusing a request sent from another origin (Origin: %s, Host: %s)", clip(origin, maxLogged), clip(r.Host, maxLogged))
		}
	}
	return nil
}
