// Command healthcheck is the container health check of the playpipe image:
// the image is distroless (no shell, no curl), so docker-compose's
// healthcheck runs this instead:
//
//	healthcheck http://127.0.0.1:9460/readyz
//
// It GETs each URL given (plain HTTP/1.0 over net, not net/http: the binary
// stays about 2 MB) and exits 0 when every answer is 2xx, 1 otherwise (saying
// why on stderr), 2 on a usage error. Each request has a 3 s deadline.
// Kubernetes does not need it: its probes speak HTTP themselves.
package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"time"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

func run(args []string, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: healthcheck URL...   (e.g. http://127.0.0.1:9460/readyz)")
		return 2
	}
	urls := make([]*url.URL, 0, len(args))
	for _, a := range args {
		u, err := url.Parse(a)
		if err != nil || u.Scheme != "http" || u.Host == "" {
			fmt.Fprintf(stderr, "healthcheck: %q is not an http:// URL\n", a)
			return 2
		}
		urls = append(urls, u)
	}
	for _, u := range urls {
		if err := check(u, 3*time.Second); err != nil {
			fmt.Fprintf(stderr, "healthcheck: GET %s: %v\n", u, err)
			return 1
		}
	}
	return 0
}

func check(u *url.URL, timeout time.Duration) error {
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "80")
	}
	conn, err := net.DialTimeout("tcp", host, timeout)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: %s\r\nUser-Agent: playpipe-healthcheck\r\n\r\n", u.RequestURI(), u.Host); err != nil {
		return err
	}
	r := bufio.NewReader(io.LimitReader(conn, 4096))
	status, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("read status line: %w", err)
	}
	// "HTTP/1.1 200 OK"
	parts := strings.SplitN(strings.TrimSpace(status), " ", 3)
	if len(parts) < 2 || !strings.HasPrefix(parts[0], "HTTP/") {
		return fmt.Errorf("not an HTTP answer: %q", status)
	}
	if len(parts[1]) == 3 && parts[1][0] == '2' {
		return nil
	}
	// The body says why (e.g. "not ready: kafka"); show its start.
	rest, _ := io.ReadAll(r)
	body := string(rest)
	if i := strings.Index(body, "\r\n\r\n"); i >= 0 {
		body = body[i+4:]
	}
	return fmt.Errorf("%s: %s", strings.Join(parts[1:], " "), strings.TrimSpace(body))
}
