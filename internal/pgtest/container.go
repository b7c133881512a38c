package pgtest

// Where nothing else answers, the repository's own tests fall back to a
// PostgreSQL container, where Docker runs, as a service's tests do when
// they import pgcontainer. It costs each test binary that imports pgtest
// about a second more to link; a service's test binaries, the demo and
// the outbox packages do not link it.
import _ "github.com/outboxgen/outboxgen/outbox/outboxtest/pgcontainer"
