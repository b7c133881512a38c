package console

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
)

// BasicAuth wraps h so that it answers only requests that carry user and
// password in HTTP basic authentication; others get 401 and a challenge
// for realm "outboxgen console". The comparison takes the same time
// whatever the credentials. Use it when no authentication of the
// service's own stands in front of the console (outboxgen console does,
// given -user); it sends the password in the clear unless the connection
// is TLS.
func BasicAuth(user, password string, h http.Handler) http.Handler {
	wantUser, wantPassword := sha256.Sum256([]byte(user)), sha256.Sum256([]byte(password))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		gotUser, gotPassword := sha256.Sum256([]byte(u)), sha256.Sum256([]byte(p))
		userOK := subtle.ConstantTimeCompare(gotUser[:], wantUser[:])
		passwordOK := subtle.ConstantTimeCompare(gotPassword[:], wantPassword[:])
		if !ok || userOK&passwordOK != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="outboxgen console", charset="UTF-8"`)
			http.Error(w, "the console needs a user name and password", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}
