//go:build unix

package edge

import (
	"crypto/x509"
	"os"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/testkit/testenv"
	"github.com/playpipe/playpipe/testkit/tlsedge"
)

// certs is a CA of the test's own and a server certificate for 127.0.0.1
// signed by it (tlsedge.WriteCerts): pool for a Go client; certFile, the
// server certificate followed by the CA, and keyFile for nginx.
type certs struct {
	pool              *x509.CertPool
	certFile, keyFile string
	all               tlsedge.Certs
}

func makeCerts(t *testing.T, dir string) certs {
	t.Helper()
	c, err := tlsedge.WriteCerts(dir)
	if err != nil {
		t.Fatal(err)
	}
	return certs{pool: c.Pool, certFile: c.CertFile, keyFile: c.KeyFile, all: c}
}

// nginxBinary skips the test where nginx is not installed, saying how to
// install it, unless PLAYPIPE_REQUIRE_NGINX=1 (`make test`, which installs
// it first) makes that a failure.
func nginxBinary(t *testing.T) {
	t.Helper()
	_, err := tlsedge.Binary()
	if err == nil {
		return
	}
	if os.Getenv("PLAYPIPE_REQUIRE_NGINX") == "1" {
		t.Fatal(err)
	}
	t.Skip("nginx not found: install it (apt-get install nginx, or `make nginx`), or run `make test`")
}

// edgeConf is one variant of the edge: nginx directives at the http level,
// the server level and the location level, and whether the listener offers
// HTTP/2.
type edgeConf struct {
	http2                     bool
	httpExtra, server, locExt string
}

// edgeLogFormat is the access log's format: protocol, method, status,
// Content-Encoding, Transfer-Encoding, the request's number on its
// connection.
const edgeLogFormat = "$server_protocol $request_method $status $sent_http_content_encoding $sent_http_transfer_encoding $connection_requests"

// nginx is one nginx process (tlsedge.Nginx) with its own prefix,
// configuration, pid file and logs in a temporary folder, listening on a
// loopback port with TLS and proxying to upstream. It is stopped by PID when
// the test ends.
type nginx struct {
	t    *testing.T
	dir  string
	addr string // host:port it listens on
	conf string // its nginx.conf: config's text, then reload
	n    *tlsedge.Nginx
}

// startNginx writes the configuration of ec in front of upstream (host:port)
// and starts nginx on a free loopback port (another port when the one chosen
// was taken meanwhile); it is stopped when the test ends.
func startNginx(t *testing.T, upstream string, cs certs, dir string, ec edgeConf) *nginx {
	t.Helper()
	cfg := edgeConfig(dir, upstream, cs, ec)
	cfg.Addr = func() (string, error) { return testenv.FreeAddr(t), nil }
	tn, err := tlsedge.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := &nginx{t: t, dir: dir, addr: tn.Addr(), conf: tn.ConfFile(), n: tn}
	t.Cleanup(n.stop)
	return n
}

// edgeConfig is the edge of ec in front of upstream, with its prefix in dir.
func edgeConfig(dir, upstream string, cs certs, ec edgeConf) tlsedge.Config {
	return tlsedge.Config{
		Dir: dir, Upstream: upstream, Certs: cs.all,
		HTTP2:     ec.http2,
		AccessLog: edgeLogFormat,
		HTTP:      ec.httpExtra,
		Server:    "ssl_session_cache shared:edge:1m;\n        " + ec.server,
		Location:  ec.locExt,
	}
}

// config is the text of nginx.conf for ec in front of upstream on n's port.
func (n *nginx) config(upstream string, cs certs, ec edgeConf) string {
	return edgeConfig(n.dir, upstream, cs, ec).File(n.addr)
}

// reload sends SIGHUP to the master: it starts new workers with the
// configuration and lets the old ones finish their requests gracefully.
func (n *nginx) reload() {
	if err := n.n.Reload(); err != nil {
		n.t.Error(err)
	}
}

// restart stops nginx with SIGTERM (fast shutdown: connections and requests
// in flight are cut) and starts it again on the same port.
func (n *nginx) restart() {
	n.t.Helper()
	if err := n.n.Restart(); err != nil {
		n.t.Error(err)
	}
}

func (n *nginx) stop() {
	n.n.Kill()
	if n.t.Failed() {
		if log := n.n.ErrorLog(); log != "" {
			n.t.Logf("nginx error.log (tail):\n%s", tail(log, 3000))
		}
	}
}

// accessLog returns the lines of the access log (edgeLogFormat).
func (n *nginx) accessLog() []string {
	lines, err := n.n.AccessLog()
	if err != nil {
		n.t.Fatal(err)
	}
	return lines
}

func tail(s string, n int) string { return tlsedge.Tail(s, n) }

// bigHeader is a response header value of n bytes.
func bigHeader(n int) string { return strings.Repeat("x", n) }
