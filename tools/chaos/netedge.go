//go:build linux

package main

import (
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
	"syscall"
	"time"
)

// netns is node 3's network namespace, reached from the host through a
// veth pair; the other nodes listen on the host end's address. A cut drops
// every packet in the namespace (nftables, policy drop): no RST, no ICMP.
type netns struct {
	ns, hostIf   string
	hostIP, nsIP string
	nextPort     int
}

const nftTable = "ppchaos_partition"

// setupNetns creates the namespace, or says why it cannot (not root, no
// ip or nft).
func setupNetns() (*netns, string) {
	if os.Geteuid() != 0 {
		return nil, "not root"
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, tool + " not installed (apt-get install -y iproute2 nftables)"
		}
	}
	pid := os.Getpid()
	x := pid%250 + 1
	n := &netns{ns: fmt.Sprintf("ppch-%d", pid), hostIf: fmt.Sprintf("ppch%dh", pid%1000000),
		hostIP: fmt.Sprintf("10.232.%d.1", x), nsIP: fmt.Sprintf("10.232.%d.2", x), nextPort: 20000 + pid%20000}
	nsIf := fmt.Sprintf("ppch%dn", pid%1000000)
	steps := [][]string{
		{"ip", "netns", "add", n.ns},
		{"ip", "link", "add", n.hostIf, "type", "veth", "peer", "name", nsIf},
		{"ip", "link", "set", nsIf, "netns", n.ns},
		{"ip", "addr", "add", n.hostIP + "/30", "dev", n.hostIf},
		{"ip", "link", "set", n.hostIf, "up"},
		{"ip", "netns", "exec", n.ns, "ip", "addr", "add", n.nsIP + "/30", "dev", nsIf},
		{"ip", "netns", "exec", n.ns, "ip", "link", "set", nsIf, "up"},
		{"ip", "netns", "exec", n.ns, "ip", "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			n.close()
			return nil, fmt.Sprintf("%s: %v: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return n, ""
}

// addr is a listener address for node id: in the namespace for node 3,
// else a free port on the host end of the veth.
func (n *netns) addr(id int) (string, error) {
	if id == 3 {
		n.nextPort++
		return fmt.Sprintf("%s:%d", n.nsIP, n.nextPort), nil
	}
	ln, err := net.Listen("tcp", n.hostIP+":0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (n *netns) cut() error {
	rules := fmt.Sprintf("table inet %[1]s {\n chain in { type filter hook input priority 0; policy drop; }\n chain out { type filter hook output priority 0; policy drop; }\n}\n", nftTable)
	cmd := exec.Command("ip", "netns", "exec", n.ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in %s: %v: %s", n.ns, err, out)
	}
	return nil
}

func (n *netns) heal() error {
	if out, err := exec.Command("ip", "netns", "exec", n.ns, "nft", "delete", "table", "inet", nftTable).CombinedOutput(); err != nil {
		return fmt.Errorf("nft delete in %s: %v: %s", n.ns, err, out)
	}
	return nil
}

func (n *netns) close() {
	_ = exec.Command("ip", "link", "del", n.hostIf).Run()
	_ = exec.Command("ip", "netns", "del", n.ns).Run()
}

// nginx is the partner's edge: TLS on a loopback port with a CA of the
// run's own (the roles trust it through SSL_CERT_FILE), proxying to the
// sandbox, as e2e/edge runs it.
type nginx struct {
	dir, addr, caFile string
	cmd               *exec.Cmd
	done              chan struct{}
}

func startNginx(dir, upstream string) (*nginx, error) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		bin = "/usr/sbin/nginx"
		if _, err := os.Stat(bin); err != nil {
			return nil, errors.New("nginx not found: `make nginx` installs it")
		}
	}
	n := &nginx{dir: dir}
	for _, d := range []string{"tmp", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	certFile, keyFile, err := makeCerts(dir)
	if err != nil {
		return nil, err
	}
	n.caFile = filepath.Join(dir, "ca.pem")
	user := ""
	if os.Getuid() == 0 {
		user = "user root;"
	}
	n.addr = mustAddr()
	tmp := filepath.Join(dir, "tmp")
	conf := fmt.Sprintf(`%s
worker_processes 1;
pid %s/nginx.pid;
error_log %s/logs/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path %s/body;
    proxy_temp_path %s/proxy;
    fastcgi_temp_path %s/fastcgi;
    uwsgi_temp_path %s/uwsgi;
    scgi_temp_path %s/scgi;
    upstream api { server %s; keepalive 32; }
    server {
        listen %s ssl;
        ssl_certificate %s;
        ssl_certificate_key %s;
        location / {
            proxy_pass http://api;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_read_timeout 120s;
        }
    }
}
`, user, dir, dir, tmp, tmp, tmp, tmp, tmp, upstream, n.addr, certFile, keyFile)
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	n.cmd = exec.Command(bin, "-p", dir, "-c", confPath, "-g", "daemon off;")
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := n.cmd.Start(); err != nil {
		return nil, fmt.Errorf("nginx: %w", err)
	}
	n.done = make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(n.done) }() // owned by the rig: kill ends it
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-n.done:
			log, _ := os.ReadFile(filepath.Join(dir, "logs", "error.log"))
			return nil, fmt.Errorf("nginx exited: %s", log)
		default:
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", n.addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // readiness probe only
		if err == nil {
			c.Close()
			return n, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.kill()
	return nil, errors.New("nginx did not accept TLS connections within 10s")
}

// kill stops nginx by its PID: SIGTERM, SIGKILL after 5 s.
func (n *nginx) kill() {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(5 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
}

// makeCerts writes a CA of its own (ca.pem) and a server certificate for
// 127.0.0.1 signed by it (cert.pem, key.pem) into dir.
func makeCerts(dir string) (certFile, keyFile string, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "playpipe chaos CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return "", "", err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	files := map[string][]byte{
		certFile:                     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		keyFile:                      pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		filepath.Join(dir, "ca.pem"): pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
	}
	for path, b := range files {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return "", "", err
		}
	}
	return certFile, keyFile, nil
}
