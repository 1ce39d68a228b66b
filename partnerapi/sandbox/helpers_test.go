package sandbox_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/testkit/testenv"
)

const testUA = "playpipe-sandbox-test/1.0 (partner integration)"

// api is a plain net/http client of one sandbox.
type api struct {
	t  testing.TB
	sb *testenv.Sandbox
	hc *http.Client
}

func newAPI(t testing.TB, sb *testenv.Sandbox) *api {
	return &api{t: t, sb: sb, hc: &http.Client{}}
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", r.body, err)
	}
	return m
}

// do sends a request; hdr are header name/value pairs (a "User-Agent" pair
// replaces the test's product agent).
func (a *api) do(method, path, token string, body any, hdr ...string) resp {
	a.t.Helper()
	return a.doURL(method, a.sb.URL+path, token, body, hdr...)
}

func (a *api) doURL(method, url, token string, body any, hdr ...string) resp {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("User-Agent", testUA)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := a.hc.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

func (a *api) creds() map[string]string {
	return map[string]string{"client_id": a.sb.ClientID, "client_signature": a.sb.ClientSignature}
}

// session takes a live token from POST /partners/session (either shape).
func (a *api) session() string {
	a.t.Helper()
	r := a.do("POST", "/partners/session", "", a.creds())
	if r.status != 200 {
		a.t.Fatalf("session: %d %s", r.status, r.body)
	}
	return tokenOf(a.t, r.body)
}

func (a *api) userSession() string {
	a.t.Helper()
	c := a.creds()
	c["email"] = a.sb.Email
	r := a.do("POST", "/partners/session/with-user", "", c)
	if r.status != 200 {
		a.t.Fatalf("session with user: %d %s", r.status, r.body)
	}
	return tokenOf(a.t, r.body)
}

// tokenOf applies the spec's rule: session.token if a string, else session.token.token.
func tokenOf(t testing.TB, body []byte) string {
	t.Helper()
	var v struct {
		Session struct {
			Token json.RawMessage `json:"token"`
		} `json:"session"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("session body %q: %v", body, err)
	}
	var s string
	if json.Unmarshal(v.Session.Token, &s) == nil {
		return s
	}
	var o struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(v.Session.Token, &o); err != nil || o.Token == "" {
		t.Fatalf("session body %q has no token", body)
	}
	return o.Token
}

func wantStatus(t testing.TB, r resp, status int) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %q", r.status, status, r.body)
	}
}

// wantEnvelope checks {error:true, reason, mix:null} byte for byte.
func wantEnvelope(t testing.TB, r resp, status int, reason string) {
	t.Helper()
	wantStatus(t, r, status)
	want, _ := json.Marshal(map[string]any{"error": true, "mix": nil, "reason": reason})
	var got map[string]any
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	gb, _ := json.Marshal(got)
	if string(gb) != string(want) {
		t.Fatalf("envelope %s, want %s", r.body, want)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("content type %q", ct)
	}
}

func wantUnauthorized(t testing.TB, r resp) {
	t.Helper()
	wantStatus(t, r, 401)
	if string(r.body) != "Unauthorized" || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
		t.Fatalf("401 body %q (%s), want plain text Unauthorized", r.body, r.header.Get("Content-Type"))
	}
}

// withEmail is the session-with-user body: the credentials and email.
func (a *api) withEmail(email string) map[string]string {
	c := a.creds()
	c["email"] = email
	return c
}
