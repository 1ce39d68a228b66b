package tlsedge

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoNginx is returned by Binary and Start where nginx is not installed.
var ErrNoNginx = errors.New("nginx not found: `make nginx` installs it (apt-get install nginx)")

// Binary finds Debian's nginx: on PATH, then /usr/sbin/nginx.
func Binary() (string, error) {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx", nil
	}
	return "", ErrNoNginx
}

// Config is one edge.
type Config struct {
	Dir      string // nginx's prefix, made if missing
	Upstream string // host:port proxied to
	Certs    Certs  // the server certificate (CertFile, KeyFile)
	// Addr returns a free loopback host:port to listen on; it is asked
	// again when nginx cannot start on the one it gave.
	Addr  func() (string, error)
	HTTP2 bool // offer HTTP/2 on the listener as well as HTTP/1.1
	// AccessLog is the log_format of logs/access.log; empty: no access log.
	AccessLog string
	// Directives added at the http, the server and the location level.
	HTTP, Server, Location string
}

// Nginx is one nginx process (a master and one worker).
type Nginx struct {
	bin, dir, conf string
	addr           string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// startTries is how many ports Start tries before it gives up.
const startTries = 5

// Start writes nginx.conf for cfg and starts nginx; see the package doc.
func Start(cfg Config) (*Nginx, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	n := &Nginx{bin: bin, dir: cfg.Dir, conf: filepath.Join(cfg.Dir, "nginx.conf")}
	for _, d := range []string{"tmp", "logs"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("nginx prefix: %w", err)
		}
	}
	var lastErr error
	for range startTries {
		if n.addr, err = cfg.Addr(); err != nil {
			return nil, fmt.Errorf("nginx port: %w", err)
		}
		if err := os.WriteFile(n.conf, []byte(cfg.File(n.addr)), 0o600); err != nil {
			return nil, fmt.Errorf("nginx.conf: %w", err)
		}
		if lastErr = n.start(); lastErr == nil {
			return n, nil
		}
	}
	return nil, fmt.Errorf("nginx did not start (%d ports tried): %w", startTries, lastErr)
}

// File is the text of nginx.conf for cfg listening on addr. A caller that
// changes its configuration writes File to ConfFile and calls Reload.
func (cfg Config) File(addr string) string {
	user := ""
	if os.Getuid() == 0 {
		user = "user root;" // workers keep access to the 0700 prefix
	}
	h2 := ""
	if cfg.HTTP2 {
		h2 = " http2" // nginx 1.22 (Debian 12): HTTP/2 is a listen parameter
	}
	access := "access_log off;"
	if cfg.AccessLog != "" {
		access = fmt.Sprintf("log_format edge '%s';\n    access_log %s edge;", cfg.AccessLog, filepath.Join(cfg.Dir, "logs", "access.log"))
	}
	tmp := filepath.Join(cfg.Dir, "tmp")
	return fmt.Sprintf(`%s
worker_processes 1;
pid %s;
error_log %s warn;
events { worker_connections 1024; }
http {
    %s
    client_body_temp_path %s/body;
    proxy_temp_path %s/proxy;
    fastcgi_temp_path %s/fastcgi;
    uwsgi_temp_path %s/uwsgi;
    scgi_temp_path %s/scgi;
    upstream api {
        server %s;
        keepalive 32;
    }
    %s
    server {
        listen %s ssl%s;
        ssl_certificate %s;
        ssl_certificate_key %s;
        %s
        location / {
            %s
            proxy_pass http://api;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
        }
    }
}
`, user, filepath.Join(cfg.Dir, "nginx.pid"), filepath.Join(cfg.Dir, "logs", "error.log"), access, tmp, tmp, tmp, tmp, tmp,
		cfg.Upstream, cfg.HTTP, addr, h2, cfg.Certs.CertFile, cfg.Certs.KeyFile, cfg.Server, cfg.Location)
}

// start runs nginx in the foreground (daemon off) and waits until it
// completes a TLS handshake on its port.
func (n *Nginx) start() error {
	cmd := exec.Command(n.bin, "-p", n.dir, "-c", n.conf, "-g", "daemon off;")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("nginx: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }() // owned by n: Kill ends it
	n.mu.Lock()
	n.cmd, n.done = cmd, done
	n.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("nginx exited: %s %s", out.String(), Tail(n.ErrorLog(), 800))
		default:
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", n.addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // readiness probe only
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.Kill()
	return errors.New("nginx did not accept TLS connections within 10s")
}

// Addr is the host:port nginx listens on.
func (n *Nginx) Addr() string { return n.addr }

// ConfFile is the path of the nginx.conf it runs with.
func (n *Nginx) ConfFile() string { return n.conf }

// Reload sends SIGHUP to the master: it starts new workers with the
// configuration and lets the old ones finish their requests gracefully.
func (n *Nginx) Reload() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		return fmt.Errorf("nginx reload: %w", err)
	}
	return nil
}

// Restart stops nginx with SIGTERM (fast shutdown: connections and requests
// in flight are cut) and starts it again on the same port.
func (n *Nginx) Restart() error {
	n.Kill()
	if err := n.start(); err != nil {
		return fmt.Errorf("nginx restart: %w", err)
	}
	return nil
}

// Kill stops the running nginx by its PID: SIGTERM, SIGKILL after 5 s.
func (n *Nginx) Kill() {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// ErrorLog is logs/error.log ("" when it cannot be read).
func (n *Nginx) ErrorLog() string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "logs", "error.log"))
	return string(b)
}

// AccessLog returns the lines of logs/access.log (Config.AccessLog's format).
func (n *Nginx) AccessLog() ([]string, error) {
	b, err := os.ReadFile(filepath.Join(n.dir, "logs", "access.log"))
	if err != nil {
		return nil, fmt.Errorf("nginx access log: %w", err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n"), nil
}

// Tail is the last max bytes of s, marked with … when cut.
func Tail(s string, max int) string {
	if len(s) <= max {
		return s
	}
	return "…" + s[len(s)-max:]
}
