// Package localpg finds a PostgreSQL for the tests and the demo on a
// machine without Docker: the server PostgreSQL's own client defaults
// reach (what psql with no arguments connects to), or else a throwaway
// cluster of its own, made with the server binaries installed on the
// machine and removed when it stops.
package localpg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a PostgreSQL that Find found or started.
type Server struct {
	// URL connects to it (as a URL, so callers may add parameters).
	URL string
	// Source is where it came from, and How says so for one line of log.
	Source Source
	How    string

	dir  string // a started cluster's files
	stop func()
}

// Source is where a Server came from.
type Source int

// Sources of a Server.
const (
	FromEnv        Source = iota // the environment variable Acquire was given
	ClientDefaults               // what PostgreSQL's client defaults reach
	Cluster                      // a throwaway cluster Find started
	Container                    // a container (RegisterContainer)
)

// Stop stops a cluster or container that was started for it (removing a
// cluster's files); for a server that was only found, it does nothing.
func (s *Server) Stop() {
	if s.stop != nil {
		s.stop()
	}
}

// Find returns the server PostgreSQL's client defaults reach, or else
// starts a throwaway cluster. Its error says what it tried.
func Find(ctx context.Context) (*Server, error) {
	dflt, err := clientDefaults(ctx)
	if err == nil {
		return &Server{URL: dflt, Source: ClientDefaults, How: "PostgreSQL's client defaults"}, nil
	}
	s, cerr := startCluster(ctx)
	if cerr == nil {
		return s, nil
	}
	return nil, fmt.Errorf("PostgreSQL's client defaults: %w; a throwaway cluster: %w", err, cerr)
}

// clientDefaults connects as psql with no arguments would (PGHOST,
// PGPORT, PGUSER, PGDATABASE, PGPASSWORD; else the local socket or
// localhost:5432, as the current user) and returns that as a URL. A
// server reached through a Unix socket is returned as 127.0.0.1 and its
// port when it answers there too, so that tests can put a TCP proxy in
// front of it.
func clientDefaults(ctx context.Context) (string, error) {
	cfg, err := pgx.ParseConfig("")
	if err != nil {
		return "", err
	}
	if err := ping(ctx, cfg); err != nil {
		return "", err
	}
	if strings.HasPrefix(cfg.Host, "/") {
		tcp := cfg.Copy()
		tcp.Host, tcp.Fallbacks = "127.0.0.1", nil
		if ping(ctx, tcp) == nil {
			cfg = tcp
		}
	}
	u := url.URL{Scheme: "postgres", User: url.User(cfg.User), Path: "/" + cfg.Database}
	if cfg.Password != "" {
		u.User = url.UserPassword(cfg.User, cfg.Password)
	}
	q := url.Values{}
	if strings.HasPrefix(cfg.Host, "/") {
		q.Set("host", cfg.Host)
		q.Set("port", strconv.Itoa(int(cfg.Port)))
	} else {
		u.Host = net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	}
	if cfg.TLSConfig == nil {
		q.Set("sslmode", "disable")
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// ping connects with cfg and closes the connection.
func ping(ctx context.Context, cfg *pgx.ConnConfig) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	return conn.Ping(cctx)
}

// binDirs are where distributions install PostgreSQL's server binaries,
// newest version first.
func binDirs() []string {
	var dirs []string
	for _, pattern := range []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/opt/homebrew/opt/postgresql@*/bin", "/usr/local/opt/postgresql@*/bin"} {
		m, _ := filepath.Glob(pattern)
		slices.SortFunc(m, func(a, b string) int { return version(b) - version(a) })
		dirs = append(dirs, m...)
	}
	return dirs
}

// version reads the major version out of a binary directory's path.
func version(dir string) int {
	digits := 0
	for _, r := range filepath.Base(filepath.Dir(dir)) {
		if r >= '0' && r <= '9' {
			digits = digits*10 + int(r-'0')
		}
	}
	return digits
}

// LookBin finds a PostgreSQL binary (initdb, pg_ctl, pg_dump, psql) on
// PATH or where distributions put the server's.
func LookBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range binDirs() {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: %s is not on PATH nor in /usr/lib/postgresql/*/bin (install PostgreSQL's server package)", ErrNoServerBinaries, name)
}

// ErrNoServerBinaries is what StartCluster's error wraps when the
// machine has no PostgreSQL server binaries to start a cluster with.
var ErrNoServerBinaries = errors.New("no PostgreSQL server binaries")

// StartCluster starts a throwaway cluster, as Find does when nothing else
// answers, with the server settings given as name=value (such as
// "max_prepared_transactions=4") on top of its own. Stop removes it. Its
// error wraps ErrNoServerBinaries when there is nothing to start it with.
func StartCluster(ctx context.Context, settings ...string) (*Server, error) {
	return startCluster(ctx, settings...)
}

// startCluster makes a cluster in a temporary directory, on a free port of
// 127.0.0.1, with trust authentication and autovacuum on, and starts it.
// initdb refuses to run as root, so as root the cluster belongs to the
// postgres user (or nobody). settings (name=value) are set on top.
func startCluster(ctx context.Context, settings ...string) (*Server, error) {
	initdb, err := LookBin("initdb")
	if err != nil {
		return nil, err
	}
	pgCtl, err := LookBin("pg_ctl")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outboxgen-pg-")
	if err != nil {
		return nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	cred, err := runAs(dir)
	if err != nil {
		cleanup()
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		cleanup()
		return nil, err
	}
	data := filepath.Join(dir, "data")
	run := func(name string, args ...string) error {
		cmd := exec.CommandContext(ctx, name, args...)
		as(cmd, cred)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %w: %s", filepath.Base(name), err, out)
		}
		return nil
	}
	if err := run(initdb, "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"); err != nil {
		cleanup()
		return nil, err
	}
	opts := fmt.Sprintf("-c port=%d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s -c autovacuum=on -c fsync=off -c max_connections=200",
		port, dir)
	for _, kv := range settings {
		opts += " -c " + kv
	}
	if err := run(pgCtl, "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start"); err != nil {
		cleanup()
		return nil, err
	}
	stop := func() {
		cmd := exec.Command(pgCtl, "-D", data, "-m", "immediate", "-w", "stop")
		as(cmd, cred)
		_ = cmd.Run()
		cleanup()
	}
	return &Server{
		URL:    fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		Source: Cluster,
		How:    fmt.Sprintf("a throwaway cluster in %s (%s)", dir, filepath.Dir(initdb)),
		dir:    dir,
		stop:   stop,
	}, nil
}

// runAs returns the credentials the cluster's commands run with: nil for
// the current user's, or as root the postgres user's (else nobody's), who
// then owns dir.
func runAs(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var errs []error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Chown(dir, int(uid), int(gid)); err != nil {
			return nil, err
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("initdb does not run as root, and no user to run it as: %w", errors.Join(errs...))
}

// freePort returns a TCP port of 127.0.0.1 that nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// as makes cmd run with cred, when set.
func as(cmd *exec.Cmd, cred *syscall.Credential) {
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
}
