package console

import (
	"net"
	"net/http"
	"net/netip"
)

// What the action log says of a request, and of each request refused.

// unauthenticatedLoopback is who a request is in the log when it carries
// no login and comes from a loopback address.
const unauthenticatedLoopback = "unauthenticated loopback"

// maxLogged bounds each header value the log repeats (in characters).
const maxLogged = 200

// maxLoggedIDs is how many ids of a selection the action log lists; it
// gives their count as well.
const maxLoggedIDs = 20

// defaultUser is Config.User's default: the basic-auth user name, else
// "unauthenticated loopback" for a request from a loopback address, else
// the remote address.
func defaultUser(r *http.Request) string {
	if u, _, ok := r.BasicAuth(); ok {
		return u
	}
	if loopbackAddr(r.RemoteAddr) {
		return unauthenticatedLoopback
	}
	return r.RemoteAddr
}

// loopbackAddr reports whether addr (ip:port) is a loopback address.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// attribution is what every record of the action log says of the
// request: who sent it, from which address, for which Host and from
// which Origin.
func (c *Console) attribution(r *http.Request) []any {
	return []any{
		"who", c.cfg.User(r),
		"remote", r.RemoteAddr,
		"host", clip(r.Host, maxLogged),
		"origin", clip(r.Header.Get("Origin"), maxLogged),
	}
}

// selectionAttrs are the action log's attributes for the ids a selection
// named: the first maxLoggedIDs and their count.
func selectionAttrs(ids []int64) []any {
	if len(ids) == 0 {
		return nil
	}
	return []any{"ids", ids[:min(len(ids), maxLoggedIDs)], "ids_count", len(ids)}
}

// Reasons of refusals, in the log.
const (
	refusedHost    = "host"
	refusedOrigin  = "origin"
	refusedToken   = "token"
	refusedActions = "actions off"
)

// refuse logs a refused request with its attribution and why, and
// answers it with status: an error page, or for a Host the console does
// not answer, plain text (the page's links would be refused too).
func (c *Console) refuse(w http.ResponseWriter, r *http.Request, rq *request, status int, reason string, err error) {
	attrs := append(c.attribution(r),
		"method", r.Method,
		"path", clip(r.URL.Path, maxLogged),
		"sec_fetch_site", clip(r.Header.Get("Sec-Fetch-Site"), maxLogged),
		"reason", reason,
		"err", err.Error())
	c.cfg.Logger.WarnContext(r.Context(), "console request refused", attrs...)
	if reason == refusedHost {
		http.Error(w, err.Error(), status)
		return
	}
	c.fail(w, r, rq, status, err)
}
