package sandbox_test

import (
	"testing"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

func TestEdgeBlocksScriptUserAgents(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	tok := a.session()
	sb.SetMode(sandbox.ModeStandby) // the edge answers before the service: no mode header
	for _, ua := range []string{"", " ", "Go-http-client/1.1", "Go-http-client/2.0", "curl/8.5.0", "curl", "python-requests/2.31.0",
		"Wget/1.21.3", "okhttp/4.12.0", "axios/1.6.2", "node-fetch/1.0 (+https://github.com/bitinn/node-fetch)", "node-fetch",
		"Java/17.0.2", "Apache-HttpClient/4.5.14 (Java/17)", "python-urllib3/2.0", "Python-urllib/3.11", "libwww-perl/6.72", "PostmanRuntime/7.36.0", "undici"} {
		for _, path := range []string{"/partners/session", "/partners/catalog", "/partners/mix/30001", "/partners/royalty-tracking", "/nowhere"} {
			method := "GET"
			if path == "/partners/session" || path == "/partners/royalty-tracking" {
				method = "POST"
			}
			r := a.do(method, path, tok, a.creds(), "User-Agent", ua)
			wantStatus(t, r, 403)
			if string(r.body) != "error code: 1010" || r.header.Get("X-Service-Served-By") != "" {
				t.Fatalf("UA %q %s: body %q, header %q", ua, path, r.body, r.header.Get("X-Service-Served-By"))
			}
		}
	}
	for _, ua := range []string{"playpipe/0.1.0 (partner integration)", "Mozilla/5.0 (X11; Linux x86_64)", "MyApp/2.3 (partner integration) curl-free"} {
		wantStatus(t, a.do("GET", "/partners/mix/30001", tok, nil, "User-Agent", ua), 200)
	}
	if got := sb.Ledger().Counters["catalog"][403]; got == 0 {
		t.Fatalf("edge blocks not counted: %v", sb.Ledger().Counters)
	}
}
