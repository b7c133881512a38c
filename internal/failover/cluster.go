package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// cluster is one PostgreSQL server of the pair: its data directory, port
// and the settings it starts with.
type cluster struct {
	name     string
	bin      string // the directory of initdb, pg_ctl, pg_basebackup
	root     string // the pair's temporary directory (sockets, logs)
	data     string
	port     int
	settings []string // name=value, on the server's command line
	cred     *syscall.Credential
}

// serverCred returns the credentials the servers run with: the current
// user's (nil), or as root the postgres user's, since initdb refuses root.
func serverCred() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, the servers run as the postgres user: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// findBin returns the directory of initdb on PATH (a link followed to
// the directory it lives in with the other server binaries), or else of
// the newest PostgreSQL server binaries installed where distributions put
// them.
func findBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	best, bestV := "", -1
	for _, d := range dirs {
		v, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err == nil && v > bestV {
			best, bestV = d, v
		}
	}
	if best == "" {
		return "", errors.New("no PostgreSQL server binaries: initdb is not on PATH nor in /usr/lib/postgresql/*/bin (-bin)")
	}
	return best, nil
}

// exec runs a server binary as the servers' user, in the pair's directory.
func (c *cluster) exec(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	cmd.Dir = c.root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// initdb makes the cluster's data directory.
func (c *cluster) initdb(ctx context.Context) error {
	return c.exec(ctx, "initdb", "-D", c.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
}

// basebackup makes the cluster a streaming standby of primary: a copy
// of its data directory with standby.signal and primary_conninfo, and a
// replication slot on the primary, so no WAL it needs is recycled.
func (c *cluster) basebackup(ctx context.Context, primary *cluster) error {
	return c.exec(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres",
		"-D", c.data, "-R", "-X", "stream", "-C", "-S", "failover_standby", "-c", "fast", "--no-sync")
}

// start starts the server and waits until it accepts connections.
func (c *cluster) start(ctx context.Context) error {
	opts := fmt.Sprintf("-c port=%d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s", c.port, c.root)
	for _, kv := range c.settings {
		opts += " -c " + kv
	}
	log := filepath.Join(c.root, c.name+".log")
	if err := c.exec(ctx, "pg_ctl", "-D", c.data, "-o", opts, "-l", log, "-w", "-t", "60", "start"); err != nil {
		return fmt.Errorf("%w; %s's log ends:\n%s", err, c.name, tail(log, 10))
	}
	return nil
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// stopImmediate stops the server as a crash would: no checkpoint, no
// last WAL sent to standbys. walsender, when not 0, is a WAL sender the
// harness stopped (SIGSTOP): it is killed once the shutdown began, so it
// sends nothing more and the shutdown need not wait for it.
func (c *cluster) stopImmediate(walsender int) error {
	pid, err := c.postmasterPID()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGQUIT); err != nil {
		return fmt.Errorf("signalling the postmaster: %w", err)
	}
	if walsender != 0 {
		_ = syscall.Kill(walsender, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return nil
		}
	}
	return fmt.Errorf("%s: the postmaster (pid %d) did not exit within 30s of an immediate shutdown", c.name, pid)
}

// postmasterPID reads the postmaster's pid from its pid file.
func (c *cluster) postmasterPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(c.data, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// promote ends the standby's recovery and waits until it accepts writes.
func (c *cluster) promote(ctx context.Context) error {
	return c.exec(ctx, "pg_ctl", "-D", c.data, "-w", "-t", "60", "promote")
}

// stop stops the server, if it runs, without waiting for clients.
func (c *cluster) stop() {
	if _, err := c.postmasterPID(); err != nil {
		return
	}
	_ = c.exec(context.Background(), "pg_ctl", "-D", c.data, "-m", "immediate", "-w", "-t", "60", "stop")
}

// url returns the URL of database db on this server alone.
func (c *cluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// exec1 runs one statement on database db of this server alone.
func (c *cluster) exec1(ctx context.Context, db, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, c.url(db))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// version returns the server's version, as PostgreSQL prints it.
func (c *cluster) version(ctx context.Context) string {
	conn, err := pgx.Connect(ctx, c.url("postgres"))
	if err != nil {
		return "PostgreSQL (version unknown: " + err.Error() + ")"
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "PostgreSQL (version unknown: " + err.Error() + ")"
	}
	return "PostgreSQL " + strings.Fields(v)[0]
}
