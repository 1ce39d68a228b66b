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

// Config configures a local server.
type Config struct {
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
	// TCPPort and HTTPPort, when both set, are the ports of a first start
	// (instead of free ones picked at start), for servers whose ports other
	// servers' configurations name before they start (testkit/chcluster's
	// replicas). A port taken by then fails the start.
	TCPPort, HTTPPort int
}

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
	stopped  bool          // Stop or Kill was called after the last Start: Watch leaves it down
}

// state is written to <Dir>/server.json so that another process can attach.
type state struct {
	PID      int `json:"pid"`
	TCPPort  int `json:"tcp_port"`
	HTTPPort int `json:"http_port"`
}

const stateFile = "server.json"

// Start starts a server in opts.Dir (or attaches to one, see Config.Reuse)
// and returns once it answers a query.
func Start(ctx context.Context, opts Config) (*Server, error) {
	if opts.Dir == "" {
		return nil, errors.New("chlocal: Config.Dir is required")
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
	st, recorded, alive := s.recorded()
	if alive {
		// A live process of this package holds the folder: attach to it
		// (waiting while it starts up, e.g. restarted by its owner's Watch),
		// never start a second server on new ports.
		if !opts.Reuse {
			return nil, fmt.Errorf("chlocal: a ClickHouse server (pid %d, native port %d) already runs in %s; stop it or use another folder", st.PID, st.TCPPort, dir)
		}
		return s.attach(ctx, st)
	}
	if opts.Binary != "" {
		if !isExecutable(opts.Binary) {
			return nil, fmt.Errorf("chlocal: the ClickHouse server binary %s is not an executable file", opts.Binary)
		}
		s.bin = binaryFor(opts.Binary)
	} else if s.bin, err = FindBinary(); err != nil {
		return nil, err
	}
	// A server that died in this folder is started again on its recorded
	// ports, so that its clients (a sink) reconnect to the same address.
	// Otherwise, or when those ports are taken, free ones are picked: a port
	// picked free can be taken by someone else before the server binds it,
	// so a few fresh pairs are tried.
	for attempt := 0; ; attempt++ {
		if attempt == 0 && recorded && st.TCPPort > 0 && st.HTTPPort > 0 {
			s.tcpPort, s.httpPort = st.TCPPort, st.HTTPPort
		} else if opts.TCPPort > 0 && opts.HTTPPort > 0 {
			s.tcpPort, s.httpPort = opts.TCPPort, opts.HTTPPort
			if err = s.Start(ctx); err != nil {
				return s, err
			}
			return s, nil
		} else if s.tcpPort, s.httpPort, err = freePorts(); err != nil {
			return nil, err
		}
		err = s.Start(ctx)
		var se *StartError
		if err == nil {
			return s, nil
		}
		if opts.Reuse {
			// Another process may have started the folder's server meanwhile
			// (its owner restarting it): use that one.
			if st, _, alive := s.recorded(); alive {
				if a, aerr := s.attach(ctx, st); aerr == nil {
					return a, nil
				}
			}
		}
		if attempt >= 2 || !errors.As(err, &se) || !strings.Contains(se.Log, "Address already in use") {
			return s, err
		}
	}
}

// recorded reads the folder's state file: recorded when there is one,
// alive when its process still runs (and, where /proc tells, is a
// ClickHouse server).
func (s *Server) recorded() (st state, recorded, alive bool) {
	b, err := os.ReadFile(filepath.Join(s.dir, stateFile))
	if err != nil || json.Unmarshal(b, &st) != nil || st.PID <= 0 {
		return state{}, false, false
	}
	return st, true, syscall.Kill(st.PID, 0) == nil && isClickHouse(st.PID)
}

// isClickHouse tells whether pid runs a ClickHouse binary (a recycled pid
// of another program is not the folder's server). Without /proc: true.
func isClickHouse(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) || !procMounted()
	}
	return bytes.Contains(b, []byte("clickhouse"))
}

func procMounted() bool {
	_, err := os.Stat("/proc/self/cmdline")
	return err == nil
}

// attach makes s a client of the live server st runs in the folder (not
// owned: Stop leaves it running), once it answers within the start timeout.
func (s *Server) attach(ctx context.Context, st state) (*Server, error) {
	wctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		pctx, pcancel := context.WithTimeout(wctx, time.Second)
		err := ping(pctx, st.HTTPPort)
		pcancel()
		if err == nil {
			break
		}
		if syscall.Kill(st.PID, 0) != nil {
			return nil, fmt.Errorf("chlocal: the ClickHouse server (pid %d) of %s exited before it answered", st.PID, s.dir)
		}
		select {
		case <-wctx.Done():
			return nil, fmt.Errorf("chlocal: a ClickHouse server (pid %d) runs in %s but did not answer on 127.0.0.1:%d within %v: %w", st.PID, s.dir, st.HTTPPort, s.timeout, err)
		case <-tick.C:
		}
	}
	s.owned = false
	s.tcpPort, s.httpPort = st.TCPPort, st.HTTPPort
	s.log.Info("clickhouse: using the local server already running in the data folder", "dir", s.dir, "addr", s.Addr(), "pid", st.PID)
	return s, nil
}

// Addr returns the native-protocol address, 127.0.0.1:port.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.tcpPort))
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
	s.cmd, s.exited, s.stopped = cmd, exited, false
	// Recorded at once (not only when it answers), so that another process
	// looking at the folder meanwhile waits for this server instead of
	// starting a second one; a failed start puts the previous record back.
	statePath := filepath.Join(s.dir, stateFile)
	previous, _ := os.ReadFile(statePath)
	mine, _ := json.Marshal(state{PID: cmd.Process.Pid, TCPPort: s.tcpPort, HTTPPort: s.httpPort})
	if err := os.WriteFile(statePath, mine, 0o644); err != nil {
		s.log.Warn("clickhouse: cannot record the server's ports", "err", err)
	}

	wctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.waitReady(wctx, exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		if cur, rerr := os.ReadFile(statePath); rerr == nil && bytes.Equal(cur, mine) {
			if len(previous) > 0 {
				_ = os.WriteFile(statePath, previous, 0o644)
			} else {
				_ = os.Remove(statePath)
			}
		}
		return &StartError{Dir: s.dir, Err: err, Log: s.LogTail()}
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
	s.stopped = true
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
// and fault tests. The data written so far survives. Used by
// testkit/testenv (tests) and tools/bench, not by the playpipe binary.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.owned || s.cmd == nil {
		return
	}
	s.stopped = true
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	_ = os.Remove(filepath.Join(s.dir, stateFile))
}

// PID returns the process id of the server this Server started (0 when it
// never started one, or attached to another process's). Used by
// tools/bench and the tests, not by the playpipe binary.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.owned || s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// LogTail is the last 2 KiB of the server's error log and of its stdout
// (what it printed before its logger started), for a failure's message.
func (s *Server) LogTail() string {
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
