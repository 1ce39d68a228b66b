package sandbox_test

import (
	"encoding/base64"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestSessionLiveShapeAndErrors(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)

	r := a.do("POST", "/partners/session", "", a.creds())
	wantStatus(t, r, 200)
	m := r.json(t)
	tok, ok := m["session"].(map[string]any)["token"].(map[string]any)
	if !ok || tok["error"] != nil || len(tok) != 2 {
		t.Fatalf("live session shape: %s", r.body)
	}
	if _, isNull := tok["error"]; !isNull {
		t.Fatalf("error key must be present and null: %s", r.body)
	}
	jwt := tok["token"].(string)
	if parts := strings.Split(jwt, "."); len(parts) != 3 {
		t.Fatalf("not a JWT: %q", jwt)
	} else if h, _ := base64.RawURLEncoding.DecodeString(parts[0]); !strings.Contains(string(h), `"HS256"`) {
		t.Fatalf("JWT header %s", h)
	}
	if r.header.Get("X-Service-Served-By") != "" {
		t.Fatal("live answer carries x-service-served-by")
	}
	wantStatus(t, a.do("GET", "/partners/catalog", jwt, nil), 200)

	const missing = "please provide user information to create session: email, salt"
	for name, body := range map[string]any{
		"no signature":    map[string]string{"client_id": sb.ClientID},
		"no client id":    map[string]string{"client_signature": sb.ClientSignature},
		"empty body":      "",
		"not json":        "client_id=playpipe01",
		"empty strings":   map[string]string{"client_id": "", "client_signature": ""},
		"signature null":  `{"client_id":"playpipe01","client_signature":null}`,
		"wrong type (id)": `{"client_id":42,"client_signature":"` + sb.ClientSignature + `"}`,
		"upper-case keys": `{"CLIENT_ID":"playpipe01","Client_Signature":"` + sb.ClientSignature + `"}`,
	} {
		t.Run(name, func(t *testing.T) {
			wantEnvelope(t, a.do("POST", "/partners/session", "", body), 401, missing)
		})
	}
	for name, body := range map[string]map[string]string{
		"wrong signature":     {"client_id": sb.ClientID, "client_signature": strings.Repeat("x", 40)},
		"wrong client id":     {"client_id": "playpipe02", "client_signature": sb.ClientSignature},
		"signature too short": {"client_id": sb.ClientID, "client_signature": sb.ClientSignature[:39]},
	} {
		t.Run(name, func(t *testing.T) {
			wantEnvelope(t, a.do("POST", "/partners/session", "", body), 400, "credentials invalid")
		})
	}
}

func TestSessionWithUser(t *testing.T) {
	sb := testenv.StartSandbox(t)
	a := newAPI(t, sb)
	body := func(id, sig, email string) map[string]string {
		m := map[string]string{}
		for k, v := range map[string]string{"client_id": id, "client_signature": sig, "email": email} {
			if v != "" {
				m[k] = v
			}
		}
		return m
	}
	r := a.do("POST", "/partners/session/with-user", "", body(sb.ClientID, sb.ClientSignature, sb.Email))
	wantStatus(t, r, 200)
	m := r.json(t)
	if _, ok := m["session"].(map[string]any)["token"].(string); !ok {
		t.Fatalf("with-user shape must be flat: %s", r.body)
	}
	// E-mail matching is case-insensitive.
	wantStatus(t, a.do("POST", "/partners/session/with-user", "", body(sb.ClientID, sb.ClientSignature, strings.ToUpper(sb.Email))), 200)

	const missing = "please provide user information to create session: email, client_id, client_signature"
	wantEnvelope(t, a.do("POST", "/partners/session/with-user", "", body("", sb.ClientSignature, sb.Email)), 401, missing)
	wantEnvelope(t, a.do("POST", "/partners/session/with-user", "", body(sb.ClientID, "", sb.Email)), 401, missing)
	wantEnvelope(t, a.do("POST", "/partners/session/with-user", "", body(sb.ClientID, sb.ClientSignature, "")), 401, missing)
	wantEnvelope(t, a.do("POST", "/partners/session/with-user", "", body(sb.ClientID, strings.Repeat("y", 40), sb.Email)), 400, "credentials invalid")
	wantEnvelope(t, a.do("POST", "/partners/session/with-user", "", body(sb.ClientID, sb.ClientSignature, "someone@else.example")), 400, "partner not found")
}

func TestTokenRejections(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	sb := testenv.StartSandbox(t, func(o *sandbox.Config) { o.Now = clk.Now; o.LiveTokenTTL = time.Hour })
	a := newAPI(t, sb)
	tok := a.session()

	other := testenv.StartSandbox(t) // another secret
	foreign := newAPI(t, other).session()

	parts := strings.Split(tok, ".")
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + parts[1] + "."
	tampered := parts[0] + "." + parts[1] + "x." + parts[2]

	for name, h := range map[string]string{
		"missing":          "",
		"Bearer prefix":    "Bearer " + tok,
		"bearer lowercase": "bearer " + tok,
		"quoted":           `"` + tok + `"`,
		"JWT prefix":       "JWT " + tok,
		"garbage":          "not-a-token",
		"two parts":        parts[0] + "." + parts[1],
		"alg none":         none,
		"tampered payload": tampered,
		"other secret":     foreign,
	} {
		t.Run(name, func(t *testing.T) {
			for _, path := range []string{"/partners/catalog", "/partners/catalog/restricted", "/partners/page/101", "/partners/list/2001", "/partners/genres/101", "/partners/mix/30001"} {
				wantUnauthorized(t, a.do("GET", path, h, nil))
			}
			wantUnauthorized(t, a.do("POST", "/partners/royalty-tracking", h, validReport(sb)))
		})
	}
	// The raw token works; 59 minutes later still, at 60 it has expired.
	wantStatus(t, a.do("GET", "/partners/mix/30001", tok, nil), 200)
	clk.Add(59 * time.Minute)
	wantStatus(t, a.do("GET", "/partners/mix/30001", tok, nil), 200)
	clk.Add(time.Minute)
	wantUnauthorized(t, a.do("GET", "/partners/mix/30001", tok, nil))
	// A new session works again.
	wantStatus(t, a.do("GET", "/partners/mix/30001", a.session(), nil), 200)
}

func TestOptionsValidation(t *testing.T) {
	for name, o := range map[string]sandbox.Config{
		"ClientID":        {ClientID: "short"},
		"ClientSignature": {ClientSignature: "short"},
		"Email":           {Email: "nobody"},
		"JWTSecret":       {JWTSecret: []byte("tiny")},
		"Pages":           {Pages: 1000},
		"MixesPerList":    {MixesPerList: -1},
		"LiveTokenTTL":    {LiveTokenTTL: -time.Second},
		"MaxBodyBytes":    {MaxBodyBytes: 10},
	} {
		_, err := sandbox.New(o)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err %v, want one naming the field", name, err)
		}
	}
	_, err := sandbox.New(sandbox.Config{ClientSignature: "s3cr3t"})
	if err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("error must not echo the signature: %v", err)
	}
}
