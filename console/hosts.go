package console

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/outboxgen/outboxgen/outbox"
)

// AnyHost, as an entry of [Config.AllowedHosts], makes the console answer
// whatever host a request names. Use it only where a login stands in
// front of the console: a page that made a browser resolve its own name
// to the console's address (DNS rebinding) gets no login, since a browser
// sends a login only to the name it was given for.
const AnyHost = "*"

// hostRule is the Host values a console answers: loopback names, and
// those of Config.AllowedHosts.
type hostRule struct {
	any   bool
	names map[string]bool // lower case, IPv6 without brackets
}

// newHostRule validates Config.AllowedHosts.
func newHostRule(allowed []string) (hostRule, error) {
	r := hostRule{names: map[string]bool{}}
	for _, h := range allowed {
		if h == AnyHost {
			r.any = true
			continue
		}
		name, ok := allowedName(h)
		if !ok {
			return r, &outbox.ConfigError{Field: "Config.AllowedHosts", Value: h,
				Rule: `must be a host name or an IP address, without a scheme, a port or a path (console.example.com, 10.0.0.5, ::1), or "*" for any host`}
		}
		r.names[name] = true
	}
	return r, nil
}

// allowedName returns the entry h of Config.AllowedHosts as it is
// compared with a request's host.
func allowedName(h string) (string, bool) {
	h = strings.ToLower(h)
	if ip, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")); err == nil && ip.Zone() == "" {
		return ip.String(), true
	}
	return h, validName(h)
}

// validName reports whether name is a DNS name: dot-separated labels of
// letters, digits, hyphens and underscores, not starting or ending with a
// hyphen, and no trailing dot.
func validName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// allows reports whether the console answers a request naming host (a
// Host header: a name or an IP address, with or without a port).
func (r hostRule) allows(host string) bool {
	if r.any {
		return true
	}
	name, ok := hostName(host)
	if !ok {
		return false
	}
	return loopbackName(name) || r.names[name]
}

// hostName returns the host of a Host value, lower case, an IPv6 address
// without its brackets; ok is false when the value is not a name or an
// address with an optional numeric port.
func hostName(host string) (name string, ok bool) {
	port := ""
	if rest, found := strings.CutPrefix(host, "["); found {
		addr, after, closed := strings.Cut(rest, "]")
		if !closed {
			return "", false
		}
		if after != "" {
			if port, ok = strings.CutPrefix(after, ":"); !ok {
				return "", false
			}
		}
		ip, err := netip.ParseAddr(addr)
		if err != nil || !ip.Is6() || ip.Zone() != "" {
			return "", false
		}
		name = ip.String()
	} else {
		name, port, _ = strings.Cut(host, ":")
		name = strings.ToLower(name)
		if ip, err := netip.ParseAddr(name); err == nil {
			name = ip.String()
		} else if !validName(name) {
			return "", false
		}
	}
	if len(port) > 5 {
		return "", false
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	return name, true
}

// loopbackName reports whether name (from hostName) is a loopback name:
// localhost and the names under it, which browsers resolve to loopback
// themselves (RFC 6761) so no other site's DNS can answer for them, or
// a loopback address (127.0.0.0/8, ::1, and 127.0.0.0/8 mapped to IPv6).
// An address cannot be rebound: a browser sends it as the Host only when
// the address is what it connected to.
func loopbackName(name string) bool {
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	ip, err := netip.ParseAddr(name)
	return err == nil && ip.Unmap().IsLoopback()
}

// checkHost refuses a request whose Host the console does not answer.
func (c *Console) checkHost(r *http.Request) error {
	if c.hosts.allows(r.Host) {
		return nil
	}
	return fmt.Errorf("this console answers only to loopback host names (localhost, *.localhost, 127.0.0.0/8, [::1]) "+
		"and to those Config.AllowedHosts names (outboxgen console -allow-host), not to %q: "+
		"open it at http://localhost:PORT/, or allow the name it is reached by", clip(r.Host, maxLogged))
}
