package sandbox_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// adminReq sends one raw admin request: body as is, hdr as name/value pairs
// ("Host" sets the Host header). It returns the status and the body.
func adminReq(t *testing.T, method, u, body string, hdr ...string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestAdminRefusesCrossOrigin drives the admin API over a real listener as
// a web page in a developer's browser would (CSRF with text/plain and form
// bodies, a foreign Origin, DNS rebinding with a foreign Host) and checks
// that nothing changed state, while curl-like requests still pass.
func TestAdminRefusesCrossOrigin(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	u, _ := url.Parse(sb.AdminURL)
	_, port, _ := net.SplitHostPort(u.Host)
	const standby = `{"mode":"standby"}`
	json := "application/json"
	for _, c := range []struct {
		name, method, path, body string
		hdr                      []string
		want                     int
		wantMsg                  string
	}{
		{"text/plain PUT", "PUT", "/admin/mode", standby, []string{"Content-Type", "text/plain"}, 415, "Content-Type: application/json"},
		{"no Content-Type PUT with body (curl -d)", "PUT", "/admin/mode", standby, nil, 415, "JSON bodies only"},
		{"form POST", "POST", "/admin/revoke-tokens", "a=b", []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, "JSON bodies only"},
		{"text/plain POST", "POST", "/admin/revoke-tokens", "{}", []string{"Content-Type", "text/plain;charset=UTF-8"}, 415, "JSON bodies only"},
		{"foreign Origin", "POST", "/admin/revoke-tokens", "", []string{"Origin", "http://evil.example"}, 403, "cross-origin"},
		{"foreign Origin with JSON", "PUT", "/admin/mode", standby, []string{"Origin", "http://evil.example", "Content-Type", json}, 403, "cross-origin"},
		{"null Origin", "PUT", "/admin/mode", standby, []string{"Origin", "null", "Content-Type", json}, 403, "cross-origin"},
		{"other port on loopback", "PUT", "/admin/mode", standby, []string{"Origin", "http://127.0.0.1:1", "Content-Type", json}, 403, "cross-origin"},
		{"Sec-Fetch-Site cross-site", "GET", "/admin/ledger", "", []string{"Sec-Fetch-Site", "cross-site"}, 403, "cross-site"},
		{"rebound Host GET", "GET", "/admin/ledger", "", []string{"Host", "evil.example:" + port}, 403, "DNS rebinding"},
		{"rebound Host with matching Origin", "PUT", "/admin/mode", standby, []string{"Host", "evil.example:" + port, "Origin", "http://evil.example:" + port, "Content-Type", json}, 403, "DNS rebinding"},
		{"foreign IP Host", "GET", "/admin/mode", "", []string{"Host", "10.9.8.7:" + port}, 403, "DNS rebinding"},
	} {
		status, body := adminReq(t, c.method, sb.AdminURL+c.path, c.body, c.hdr...)
		if status != c.want || !strings.Contains(body, c.wantMsg) {
			t.Errorf("%s: %d %s, want %d with %q", c.name, status, body, c.want, c.wantMsg)
		}
	}
	if sb.Mode() != sandbox.ModeLive {
		t.Fatalf("a refused request changed the mode to %v", sb.Mode())
	}
	wantStatus(t, a.do("GET", "/partners/catalog", tok, nil), 200) // not revoked

	// What curl, the tests and the bench send passes.
	for _, c := range []struct {
		name, method, path, body string
		hdr                      []string
	}{
		{"JSON PUT", "PUT", "/admin/mode", `{"mode":"live"}`, []string{"Content-Type", json}},
		{"JSON with charset", "PUT", "/admin/mode", `{"mode":"live"}`, []string{"Content-Type", "application/json; charset=utf-8"}},
		{"own Origin", "PUT", "/admin/mode", `{"mode":"live"}`, []string{"Content-Type", json, "Origin", sb.AdminURL}},
		{"localhost Host", "GET", "/admin/mode", "", []string{"Host", "localhost:" + port}},
		{"same-origin fetch", "GET", "/admin/mode", "", []string{"Sec-Fetch-Site", "same-origin"}},
		{"empty POST without Content-Type", "POST", "/admin/revoke-tokens", "", nil},
	} {
		if status, body := adminReq(t, c.method, sb.AdminURL+c.path, c.body, c.hdr...); status != 200 {
			t.Errorf("%s: %d %s, want 200", c.name, status, body)
		}
	}
	wantUnauthorized(t, a.do("GET", "/partners/catalog", tok, nil)) // the allowed revoke took effect
}

// TestAdminHostNames: the listener's own address (read from the
// connection), loopback names and Config.AdminHosts pass; others do not.
func TestAdminHostNames(t *testing.T) {
	srv, err := sandbox.New(sandbox.Config{AdminAllowRemote: true, AdminHosts: []string{"sandbox"}})
	if err != nil {
		t.Fatal(err)
	}
	local := &net.TCPAddr{IP: net.ParseIP("10.0.0.5"), Port: 9465}
	for host, want := range map[string]int{
		"10.0.0.5:9465": 200, "sandbox:9465": 200, "SANDBOX": 200, "localhost": 200, "app.localhost:1": 200,
		"127.0.0.2:9465": 200, "[::1]:9465": 200,
		"10.0.0.6:9465": 403, "sandbox.evil.example": 403, "": 403, "evil.example": 403, "localhost.evil.example": 403,
	} {
		req := httptest.NewRequest("GET", "/admin/mode", nil)
		req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, net.Addr(local)))
		req.RemoteAddr = "10.0.0.9:5555"
		req.Host = host
		w := httptest.NewRecorder()
		srv.AdminHandler().ServeHTTP(w, req)
		if w.Code != want {
			t.Errorf("Host %q: %d %s, want %d", host, w.Code, w.Body, want)
		}
	}
}
