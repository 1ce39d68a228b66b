//go:build unix

package edge

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/testkit/testenv"
)

// certs is a CA of the test's own and a server certificate for 127.0.0.1
// signed by it, written as PEM into dir.
type certs struct {
	pool              *x509.CertPool
	certFile, keyFile string
}

func makeCerts(t *testing.T, dir string) certs {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "playpipe edge test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c := certs{pool: x509.NewCertPool(), certFile: filepath.Join(dir, "cert.pem"), keyFile: filepath.Join(dir, "key.pem")}
	c.pool.AddCert(ca)
	chain := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})...)
	if err := os.WriteFile(c.certFile, chain, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// nginxBinary finds Debian's nginx (PATH, then /usr/sbin). Without it the
// test is skipped, saying how to install it, unless PLAYPIPE_REQUIRE_NGINX=1
// (`make test`, which installs it first) makes that a failure.
func nginxBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx"
	}
	if os.Getenv("PLAYPIPE_REQUIRE_NGINX") == "1" {
		t.Fatal("nginx not found: `make nginx` installs it (apt-get install nginx)")
	}
	t.Skip("nginx not found: install it (apt-get install nginx, or `make nginx`), or run `make test`")
	return ""
}

// edgeConf is one variant of the edge: nginx directives at the http level,
// the server level and the location level, and whether the listener offers
// HTTP/2.
type edgeConf struct {
	http2                     bool
	httpExtra, server, locExt string
}

// nginx is one nginx process (a master and one worker) with its own prefix,
// configuration, pid file and error log in a temporary folder, listening on
// a loopback port with TLS and proxying to upstream. It is stopped by PID.
type nginx struct {
	t        *testing.T
	bin, dir string
	addr     string // host:port it listens on
	conf     string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// startNginx writes the configuration of ec in front of upstream (host:port)
// and starts nginx on a free loopback port (another port when the one chosen
// was taken meanwhile); it is stopped when the test ends.
func startNginx(t *testing.T, upstream string, cs certs, dir string, ec edgeConf) *nginx {
	t.Helper()
	n := &nginx{t: t, bin: nginxBinary(t), dir: dir}
	for _, d := range []string{"tmp", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(n.stop)
	var lastErr error
	for range 5 {
		n.addr = testenv.FreeAddr(t)
		n.conf = filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(n.conf, []byte(n.config(upstream, cs, ec)), 0o600); err != nil {
			t.Fatal(err)
		}
		if lastErr = n.start(); lastErr == nil {
			return n
		}
	}
	t.Fatalf("nginx did not start: %v", lastErr)
	return nil
}

func (n *nginx) config(upstream string, cs certs, ec edgeConf) string {
	user := ""
	if os.Getuid() == 0 {
		user = "user root;" // workers keep access to the test's 0700 folder
	}
	h2 := ""
	if ec.http2 {
		h2 = " http2" // nginx 1.22 (Debian 12): HTTP/2 is a listen parameter
	}
	tmp := filepath.Join(n.dir, "tmp")
	return fmt.Sprintf(`%s
worker_processes 1;
pid %s;
error_log %s warn;
events { worker_connections 1024; }
http {
    log_format edge '$server_protocol $request_method $status $sent_http_content_encoding $sent_http_transfer_encoding $connection_requests';
    access_log %s edge;
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
        ssl_session_cache shared:edge:1m;
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
`, user, filepath.Join(n.dir, "nginx.pid"), filepath.Join(n.dir, "logs", "error.log"), filepath.Join(n.dir, "logs", "access.log"), tmp, tmp, tmp, tmp, tmp,
		upstream, ec.httpExtra, n.addr, h2, cs.certFile, cs.keyFile, ec.server, ec.locExt)
}

// start runs nginx in the foreground (daemon off) and waits until it
// completes a TLS handshake on its port.
func (n *nginx) start() error {
	cmd := exec.Command(n.bin, "-p", n.dir, "-c", n.conf, "-g", "daemon off;")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	n.mu.Lock()
	n.cmd, n.done = cmd, done
	n.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(n.dir, "logs", "error.log"))
			return fmt.Errorf("nginx exited: %s %s", out.String(), tail(string(log), 800))
		default:
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", n.addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // readiness probe only
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.kill()
	return errors.New("nginx did not accept TLS connections within 10s")
}

// reload sends SIGHUP to the master: it starts new workers with the
// configuration and lets the old ones finish their requests gracefully.
func (n *nginx) reload() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		n.t.Errorf("nginx reload: %v", err)
	}
}

// restart stops nginx with SIGTERM (fast shutdown: connections and requests
// in flight are cut) and starts it again on the same port.
func (n *nginx) restart() {
	n.t.Helper()
	n.kill()
	if err := n.start(); err != nil {
		n.t.Errorf("nginx restart: %v", err)
	}
}

// kill stops the running nginx by its PID: SIGTERM, SIGKILL after 5 s.
func (n *nginx) kill() {
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

func (n *nginx) stop() {
	n.kill()
	if n.t.Failed() {
		if log, err := os.ReadFile(filepath.Join(n.dir, "logs", "error.log")); err == nil {
			n.t.Logf("nginx error.log (tail):\n%s", tail(string(log), 3000))
		}
	}
}

// accessLog returns the lines of the access log (format edge: protocol,
// method, status, Content-Encoding, Transfer-Encoding, the request's number
// on its connection).
func (n *nginx) accessLog() []string {
	b, err := os.ReadFile(filepath.Join(n.dir, "logs", "access.log"))
	if err != nil {
		n.t.Fatalf("access log: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// bigHeader is a response header value of n bytes.
func bigHeader(n int) string { return strings.Repeat("x", n) }
