package chlocal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNotInstalled is returned when no ClickHouse server binary can be found.
var ErrNotInstalled = errors.New("chlocal: no ClickHouse server binary found (looked for clickhouse-server and clickhouse on PATH, in /usr/sbin, /usr/bin and /usr/local/bin); " +
	"install it with `apt-get install -y clickhouse-server` (Debian/Ubuntu), or see https://clickhouse.com/docs/en/install, " +
	"or set PLAYPIPE_CLICKHOUSE_BIN to its path, or point playpipe at a running server with PLAYPIPE_CLICKHOUSE_ADDR")

// ErrNotRunning is returned by operations that need a running server.
var ErrNotRunning = errors.New("chlocal: server is not running")

// StartError is a failed start: the server exited or never answered. Log
// holds the tail of the server's error log, which usually says why.
type StartError struct {
	Dir string
	Err error
	Log string
}

func (e *StartError) Error() string {
	msg := fmt.Sprintf("chlocal: start ClickHouse in %s: %v", e.Dir, e.Err)
	if e.Log != "" {
		msg += "\n--- tail of the server's error log ---\n" + e.Log
	}
	return msg
}

func (e *StartError) Unwrap() error { return e.Err }

// Options configure a local server.
type Options struct {
	// Dir is the data folder (created when missing). Required.
	Dir string
	// Binary is the server binary; defaults to the first found by FindBinary.
	Binary string
	// StartTimeout bounds the wait for the first answer; defaults to 30 s.
	StartTimeout time.Duration
	// Reuse attaches to a server that this package already runs in Dir
	// (started by another process) when it answers, instead of failing on the
	// folder's lock. Such a server is not owned: Stop leaves it running.
	Reuse bool
	// Logger receives start/stop messages; defaults to slog.Default().
	Logger *slog.Logger
}

// Binary is a located server executable and the arguments that select the
// server mode before the configuration flag.
type Binary struct {
	Path string
	Args []string // nil for clickhouse-server, ["server"] for the single clickhouse binary
}

// FindBinary locates the ClickHouse server: PLAYPIPE_CLICKHOUSE_BIN, then
// clickhouse-server and clickhouse on PATH, then the usual system folders.
func FindBinary() (Binary, error) {
	if p := os.Getenv("PLAYPIPE_CLICKHOUSE_BIN"); p != "" {
		if !isExecutable(p) {
			return Binary{}, fmt.Errorf("chlocal: PLAYPIPE_CLICKHOUSE_BIN=%s is not an executable file", p)
		}
		return binaryFor(p), nil
	}
	for _, name := range []string{"clickhouse-server", "clickhouse"} {
		if p, err := exec.LookPath(name); err == nil {
			return binaryFor(p), nil
		}
	}
	for _, dir := range systemDirs {
		for _, name := range []string{"clickhouse-server", "clickhouse"} {
			p := filepath.Join(dir, name)
			if isExecutable(p) {
				return binaryFor(p), nil
			}
		}
	}
	return Binary{}, ErrNotInstalled
}

func binaryFor(p string) Binary {
	if filepath.Base(p) == "clickhouse" {
		return Binary{Path: p, Args: []string{"server"}}
	}
	return Binary{Path: p}
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// systemDirs are searched after PATH.
var systemDirs = []string{"/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"}

// Server is a local ClickHouse server process in a data folder.
type Server struct {
	dir     string
	bin     Binary
	timeout time.Duration
	log     *slog.Logger
	owned   bool

	mu       sync.Mutex
	tcpPort  int
	httpPort int
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the current process has exited
}

// state is written to <Dir>/server.json so that another process can attach.
type state struct {
	PID      int `json:"pid"`
	TCPPort  int `json:"tcp_port"`
	HTTPPort int `json:"http_port"`
}

const stateFile = "server.json"

// Start starts a server in opts.Dir (or attaches to one, see Options.Reuse)
// and returns once it answers a query.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, errors.New("chlocal: Options.Dir is required")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("chlocal: data folder %q: %w", opts.Dir, err)
	}
	s := &Server{dir: dir, timeout: opts.StartTimeout, log: opts.Logger, owned: true}
	if s.timeout <= 0 {
		s.timeout = 30 * time.Second
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if st, ok := s.running(ctx); ok {
		if !opts.Reuse {
			return nil, fmt.Errorf("chlocal: a ClickHouse server (pid %d, native port %d) already runs in %s; stop it or use another folder", st.PID, st.TCPPort, dir)
		}
		{
			s.owned = false
			s.tcpPort, s.httpPort = st.TCPPort, st.HTTPPort
			s.log.Info("clickhouse: using the local server already running in the data folder", "dir", dir, "addr", s.Addr(), "pid", st.PID)
			return s, nil
		}
	}
	if opts.Binary != "" {
		s.bin = binaryFor(opts.Binary)
	} else if s.bin, err = FindBinary(); err != nil {
		return nil, err
	}
	// A port picked free can be taken by someone else before the server
	// binds it; try a few fresh pairs.
	for attempt := 0; ; attempt++ {
		if s.tcpPort, s.httpPort, err = freePorts(); err != nil {
			return nil, err
		}
		err = s.Start(ctx)
		var se *StartError
		if err == nil || attempt >= 2 || !errors.As(err, &se) || !strings.Contains(se.Log, "Address already in use") {
			return s, err
		}
	}
}

// running returns the state of a live server of this package in s.dir.
func (s *Server) running(ctx context.Context) (state, bool) {
	b, err := os.ReadFile(filepath.Join(s.dir, stateFile))
	if err != nil {
		return state{}, false
	}
	var st state
	if json.Unmarshal(b, &st) != nil || st.PID <= 0 || syscall.Kill(st.PID, 0) != nil {
		return state{}, false
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return st, ping(cctx, st.HTTPPort) == nil
}

// Addr returns the native-protocol address, 127.0.0.1:port.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.tcpPort))
}

// HTTPAddr returns the HTTP interface address, 127.0.0.1:port.
func (s *Server) HTTPAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.httpPort))
}

// Dir returns the data folder.
func (s *Server) Dir() string { return s.dir }

// Owned reports whether this Server started the process (false when it
// attached to one run by another process).
func (s *Server) Owned() bool { return s.owned }

// Start (re)starts a stopped server on the same folder and ports, keeping
// its data, and waits until it answers. Starting a running server is a no-op.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.owned {
		return nil
	}
	if s.cmd != nil {
		select {
		case <-s.exited:
		default:
			return nil
		}
	}
	if err := s.writeConfig(); err != nil {
		return err
	}
	out, err := os.OpenFile(filepath.Join(s.dir, "log", "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("chlocal: %w", err)
	}
	args := append(append([]string(nil), s.bin.Args...), "--config-file="+filepath.Join(s.dir, "config.xml"))
	cmd := exec.Command(s.bin.Path, args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = procAttr()
	begin := time.Now()
	if err := cmd.Start(); err != nil {
		out.Close()
		return &StartError{Dir: s.dir, Err: err}
	}
	exited := make(chan struct{})
	go func() { // owner: the process; ends when it exits
		_ = cmd.Wait()
		out.Close()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited

	wctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.waitReady(wctx, exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return &StartError{Dir: s.dir, Err: err, Log: s.errorLogTail()}
	}
	b, _ := json.Marshal(state{PID: cmd.Process.Pid, TCPPort: s.tcpPort, HTTPPort: s.httpPort})
	if err := os.WriteFile(filepath.Join(s.dir, stateFile), b, 0o644); err != nil {
		s.log.Warn("clickhouse: cannot record the server's ports", "err", err)
	}
	s.log.Info("clickhouse: local server started", "dir", s.dir, "addr", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.tcpPort)),
		"binary", s.bin.Path, "took", time.Since(begin).Round(time.Millisecond))
	return nil
}

func (s *Server) waitReady(ctx context.Context, exited <-chan struct{}) error {
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		last = ping(pctx, s.httpPort)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("the server exited during start-up")
		case <-ctx.Done():
			return fmt.Errorf("no answer within %v: %w (last: %v)", s.timeout, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// pingClient keeps no idle connection: an idle one delays the server's shutdown.
var pingClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// ping runs SELECT 1 over HTTP.
func ping(ctx context.Context, httpPort int) error {
	u := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort)) + "/?query=" + url.QueryEscape("SELECT 1")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := pingClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "1" {
		return fmt.Errorf("SELECT 1 answered %d %q", resp.StatusCode, bytes.TrimSpace(body))
	}
	return nil
}

// Stop stops the server: SIGTERM, then SIGKILL when ctx ends first. The data
// stays in the folder; Start brings the server back. Stopping a stopped (or
// not owned) server is a no-op.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.owned || s.cmd == nil {
		return nil
	}
	select {
	case <-s.exited:
		return nil
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-ctx.Done():
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	_ = os.Remove(filepath.Join(s.dir, stateFile))
	return nil
}

// Kill stops the server at once with SIGKILL (a crash): for throwaway folders
// and fault tests. The data written so far survives.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.owned || s.cmd == nil {
		return
	}
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	_ = os.Remove(filepath.Join(s.dir, stateFile))
}

// Running reports whether the server process is alive.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.owned {
		return true
	}
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

func (s *Server) errorLogTail() string {
	var parts []string
	for _, name := range []string{"error.log", "stdout.log"} {
		b, err := os.ReadFile(filepath.Join(s.dir, "log", name))
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		if len(b) > 2048 {
			b = b[len(b)-2048:]
		}
		parts = append(parts, string(b))
	}
	return strings.Join(parts, "\n")
}

func freePorts() (int, int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, fmt.Errorf("chlocal: pick a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports[0], ports[1], nil
}

func (s *Server) writeConfig() error {
	for _, sub := range []string{"data", "tmp", "log", "user_files", "format_schemas"} {
		if err := os.MkdirAll(filepath.Join(s.dir, sub), 0o755); err != nil {
			return fmt.Errorf("chlocal: data folder: %w", err)
		}
	}
	p := func(sub string) string { return xmlEscape(filepath.Join(s.dir, sub) + "/") }
	// The root element's name is ignored by the configuration loader of
	// every release; 18.16 documents <yandex>, current ones <clickhouse>.
	config := `<?xml version="1.0"?>
<!-- Written by playpipe (internal/chlocal) on every start; edits are overwritten. -->
<yandex>
    <logger>
        <level>warning</level>
        <log>` + p("log") + `server.log</log>
        <errorlog>` + p("log") + `error.log</errorlog>
        <size>10M</size>
        <count>2</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>` + strconv.Itoa(s.tcpPort) + `</tcp_port>
    <http_port>` + strconv.Itoa(s.httpPort) + `</http_port>
    <path>` + p("data") + `</path>
    <tmp_path>` + p("tmp") + `</tmp_path>
    <user_files_path>` + p("user_files") + `</user_files_path>
    <format_schema_path>` + p("format_schemas") + `</format_schema_path>
    <users_config>users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <mark_cache_size>268435456</mark_cache_size>
    <uncompressed_cache_size>268435456</uncompressed_cache_size>
    <max_concurrent_queries>100</max_concurrent_queries>
    <mlock_executable>false</mlock_executable>
    <shutdown_wait_unfinished>2</shutdown_wait_unfinished>
</yandex>
`
	users := `<?xml version="1.0"?>
<!-- Written by playpipe (internal/chlocal): one passwordless user, loopback only. -->
<yandex>
    <profiles>
        <default>
            <log_queries>0</log_queries>
            <!-- An idle native connection checks for shutdown every poll_interval
                 seconds (default 10): 1 makes a stop take about a second. -->
            <poll_interval>1</poll_interval>
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks>
                <ip>127.0.0.1</ip>
                <ip>::1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
            <access_management>1</access_management>
        </default>
    </users>
    <quotas>
        <default></default>
    </quotas>
</yandex>
`
	if err := os.WriteFile(filepath.Join(s.dir, "config.xml"), []byte(config), 0o644); err != nil {
		return fmt.Errorf("chlocal: write config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, "users.xml"), []byte(users), 0o644); err != nil {
		return fmt.Errorf("chlocal: write users: %w", err)
	}
	return nil
}

func xmlEscape(s string) string {
	var b bytes.Buffer
	for _, r := range s {
		switch r {
		case '&':
			b.WriteString("&amp;")
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
