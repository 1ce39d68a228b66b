package partnerapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/playpipe/playpipe/schemas"
)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// printAll formats v in every way a careless caller might.
func printAll(v any) string {
	var b bytes.Buffer
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%T %v"} {
		fmt.Fprintf(&b, f+"\n", v)
	}
	fmt.Fprintln(&b, v)
	fmt.Fprint(&b, v)
	j, _ := json.Marshal(v)
	b.Write(j)
	slog.New(slog.NewTextHandler(&b, nil)).Info("x", "v", v)
	slog.New(slog.NewJSONHandler(&b, nil)).Info("x", "v", v)
	return b.String()
}

func TestCredentialsRedacted(t *testing.T) {
	cr := Credentials{ClientID: testID, ClientSignature: testSig, Email: "ops@example.com"}
	cfg := Config{BaseURL: "http://x", Credentials: cr}
	for _, v := range []any{cr, &cr, cfg, &cfg, []Credentials{cr}, map[string]any{"c": cr}, struct{ C Credentials }{cr}} {
		out := printAll(v)
		if strings.Contains(out, testSig) || strings.Contains(out, testSig[:20]) {
			t.Fatalf("signature printed by %T:\n%s", v, out)
		}
		if !strings.Contains(out, testID) || !strings.Contains(out, "[REDACTED]") {
			t.Fatalf("%T: client id or redaction mark missing:\n%s", v, out)
		}
	}
	// The hex form of the signature must not appear either.
	if strings.Contains(printAll(cr), fmt.Sprintf("%x", testSig)) {
		t.Fatal("hex signature printed")
	}
}

// TestNoSecretInLogsErrorsTraces drives a client through sessions, a 401
// renewal, errors that echo the request, and checks logs, errors and spans.
func TestNoSecretInLogsErrorsTraces(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))

	calls := 0
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		calls++
		tok := r.Header.Get("Authorization")
		switch calls {
		case 1:
			w.WriteHeader(401)
			fmt.Fprint(w, "Unauthorized")
		case 2:
			w.WriteHeader(400)
			fmt.Fprintf(w, `{"error":true,"reason":"token %s is odd"}`, tok)
		default:
			w.WriteHeader(500)
			fmt.Fprintf(w, `{"error":true,"reason":"internal service error %s"}`, tok)
		}
	})
	var logs bytes.Buffer
	c := f.client(t, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.MaxAttempts = 1
		c.TracerProvider = tp
	})
	var errs bytes.Buffer
	for range 3 {
		_, _, err := c.Mix(context.Background(), 1)
		if err == nil {
			t.Fatal("no error")
		}
		errs.WriteString(printAll(err))
	}
	_, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1})
	errs.WriteString(printAll(err))
	c.Close()
	_ = tp.ForceFlush(context.Background())
	var spans bytes.Buffer
	for _, s := range rec.Ended() {
		fmt.Fprintf(&spans, "%s %v %v %v\n", s.Name(), s.Attributes(), s.Status(), s.Events())
	}
	if rec.Ended() == nil {
		t.Fatal("no spans recorded")
	}
	for name, out := range map[string]string{"logs": logs.String(), "errors": errs.String(), "spans": spans.String()} {
		if strings.Contains(out, testSig) {
			t.Errorf("signature in %s:\n%s", name, out)
		}
		for _, tok := range []string{"tok1", "tok2", "tok3"} {
			if strings.Contains(out, tok) {
				t.Errorf("token %s in %s:\n%s", tok, name, out)
			}
		}
	}
	if !strings.Contains(logs.String(), "session created") {
		t.Errorf("renewals not logged:\n%s", logs.String())
	}
}

func TestConfigValidationNamesField(t *testing.T) {
	ok := Config{BaseURL: "http://127.0.0.1:1", Credentials: Credentials{ClientID: testID, ClientSignature: testSig}}
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.BaseURL = "" }, "Config.BaseURL"},
		{func(c *Config) { c.BaseURL = "ftp://x" }, "Config.BaseURL"},
		{func(c *Config) { c.BaseURL = "http://x/?a=b" }, "Config.BaseURL"},
		{func(c *Config) { c.Credentials.ClientID = "" }, "Config.Credentials.ClientID"},
		{func(c *Config) { c.Credentials.ClientSignature = "" }, "Config.Credentials.ClientSignature"},
		{func(c *Config) { c.Credentials.Email = "nope" }, "Config.Credentials.Email"},
		{func(c *Config) { c.MaxConns = -1 }, "Config.MaxConns"},
		{func(c *Config) { c.MaxAttempts = -2 }, "Config.MaxAttempts"},
		{func(c *Config) { c.RequestTimeout = -1 }, "Config.RequestTimeout"},
		{func(c *Config) { c.BaseBackoff = 5e9; c.MaxBackoff = 1e9 }, "Config.MaxBackoff"},
		{func(c *Config) { c.UserAgent = "a\r\nb" }, "Config.UserAgent"},
		{func(c *Config) { c.CredentialsFile = "/nonexistent/creds" }, "Config.CredentialsFile"},
	} {
		cfg := ok
		tc.mod(&cfg)
		_, err := New(cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want error naming %s, got %v", tc.want, err)
		}
		if err != nil && strings.Contains(err.Error(), testSig) {
			t.Errorf("signature in %v", err)
		}
	}
	c, err := New(ok)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.cfg.MaxConns != 64 || c.transport.MaxIdleConnsPerHost != 64 || c.transport.MaxConnsPerHost != 64 || c.cfg.UserAgent == "" {
		t.Fatalf("defaults: %+v", c.cfg)
	}
}

// TestCredentialsFilePrecedence: fields set in the Config (from flags or
// the environment, bound by cmd/playpipe) win over the credentials file,
// which fills the rest. The flag and environment side is tested in
// cmd/playpipe (TestPartnerFlagsEnvAndFile).
func TestCredentialsFilePrecedence(t *testing.T) {
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "creds.json")
	os.WriteFile(jsonFile, []byte(`{"client_id":"fromfile01","client_signature":"`+testSig+`","email":"f@example.com"}`), 0o600)
	envFile := filepath.Join(dir, "creds.env")
	os.WriteFile(envFile, []byte("# comment\nPLAYPIPE_API_CLIENT_ID=envfile001\nclient_signature='"+testSig+"'\n"), 0o600)

	c, err := New(Config{BaseURL: "http://127.0.0.1:9", Credentials: Credentials{ClientID: "fromenv001"}, CredentialsFile: jsonFile,
		MaxConns: 8, RequestTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := c.cfg
	if got.BaseURL != "http://127.0.0.1:9" || got.Credentials.ClientID != "fromenv001" || got.Credentials.ClientSignature != testSig ||
		got.Credentials.Email != "f@example.com" || got.MaxConns != 8 || got.RequestTimeout.String() != "3s" {
		t.Fatalf("precedence config > file broken: %+v", got)
	}

	// KEY=VALUE file; a signature in the config wins over the file.
	c2, err := New(Config{BaseURL: "http://127.0.0.1:9", Credentials: Credentials{ClientSignature: "Z" + testSig[1:]}, CredentialsFile: envFile})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if c2.cfg.Credentials.ClientID != "envfile001" || c2.cfg.Credentials.ClientSignature != "Z"+testSig[1:] {
		t.Fatalf("%+v", c2.cfg)
	}

	// Every error of New wraps ErrInvalidConfig, a missing file's included.
	if _, err := New(Config{BaseURL: "http://127.0.0.1:9", CredentialsFile: filepath.Join(dir, "none")}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("missing credentials file: err = %v, want ErrInvalidConfig", err)
	}
	if _, err := New(Config{}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "--api-url") {
		t.Fatalf("empty config: err = %v, want ErrInvalidConfig naming --api-url", err)
	}
}

func TestCredentialsFileErrorsHideValues(t *testing.T) {
	for _, data := range []string{`{"client_signature": "` + testSig + `",}`, testSig + "\n", "bogus=" + testSig} {
		_, err := parseCredentials("f", []byte(data))
		if err == nil || strings.Contains(err.Error(), testSig) {
			t.Errorf("%q: err %v", data, err)
		}
	}
}

// FuzzDecoders feeds every tolerant decoder arbitrary bytes: none may panic.
func FuzzDecoders(f *testing.F) {
	for _, s := range []string{
		`{"session":{"token":{"token":"a.b.c","error":null}}}`, `{"session":{"token":"a.b.c"}}`,
		`{"catalogs":[{"page_id":1,"title":"t","type":"x","ranking":1,"list_count":2}]}`,
		`{"page":{"id":1,"title":"P","lists":[{"list_id":2,"ranking":1,"image":{"thumbnail":"t"}}]}}`,
		`{"list":{"id":3,"mixes":[{"id":1,"explicit":1,"bpm":120},{"id":2,"explicit":true,"min_bpm":1,"dj":{"name":"x"}}]}}`,
		`{"rows":{"items":null}}`, `{"rows":{"items":[{"id":1}]}}`,
		`{"mix":{"id":1,"explicit":false,"dj":"n","tracks":[{"id":1,"time":"00:01:00","isrc":"x "}]}}`,
		`{"error":true,"reason":"Mix not found","mix":null}`, `{"error":true,"message":"include the required fields: a,b"}`,
		`Unauthorized`, `{"error":false,"message":"ok"}`, "eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjJ9.x", "\xff\x00", `{"message":"`,
	} {
		f.Add([]byte(s))
	}
	c := &Client{}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = decodeSession(data)
		_, _ = decodeCatalog(data)
		_, _ = decodePage(data)
		_, _ = decodeList(data)
		_, _ = decodeGenreRow(data)
		_, _ = decodeMix(data)
		_, _ = jwtExpiry(string(data))
		r := errorReason(403, data, func(s string) string { return s })
		_ = parseFields(r)
		_ = parseFields(string(data))
		_ = parseRetryAfter(string(data), timeZero)
		_ = c.reportMessage(data)
		_, _ = parseCredentials("fuzz", data)
		_, _ = ParseHMS(string(data))
		var b FlexBool
		_ = b.UnmarshalJSON(data)
		_, _ = readInto(nil, io.LimitReader(bytes.NewReader(data), 1<<20), 64)
	})
}

var timeZero = time.Time{}

// TestReport401EchoScrubbed: an edge page answering 401 to a play report
// and echoing the request's Authorization header does not put the token
// in the error (the Delivery record's message, the ledger) or the logs:
// the body is scrubbed before the token is dropped.
func TestReport401EchoScrubbed(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, "<html><body><h1>401</h1><pre>Authorization: %s</pre></body></html>", r.Header.Get("Authorization"))
	})
	var logs bytes.Buffer
	c := f.client(t, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	for range 2 {
		_, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1})
		if KindOf(err) != KindUnauthorized {
			t.Fatalf("err = %v, want KindUnauthorized", err)
		}
		out := printAll(err)
		for _, tok := range []string{"tok1", "tok2"} {
			if strings.Contains(out, tok) {
				t.Errorf("token %s in the error:\n%s", tok, out)
			}
		}
		if !strings.Contains(err.Error(), redacted) {
			t.Errorf("err = %v, want the token %s", err, redacted)
		}
	}
	if strings.Contains(logs.String(), "tok1") || strings.Contains(logs.String(), "tok2") {
		t.Errorf("token in the logs:\n%s", logs.String())
	}
}

// TestSecretStraddlingTheCutScrubbed: an edge page echoing the signature
// where the error's reason (200 bytes) and the log's first bytes (120) are
// cut: no prefix of it reaches either — the text is scrubbed before it is
// cut, so a secret cut in two is still found whole.
func TestSecretStraddlingTheCutScrubbed(t *testing.T) {
	var sig string
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprint(w, strings.Repeat("x", 115)+sig+strings.Repeat("y", 40)+sig+" end")
	})
	var logs bytes.Buffer
	c := f.client(t, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	sig = c.cfg.Credentials.ClientSignature
	if len(sig) < 20 {
		t.Fatalf("signature %q too short for the test", sig)
	}
	_, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1})
	if err == nil {
		t.Fatal("a 502 page answered without an error")
	}
	prefix := sig[:5] // what lies before each cut
	if out := printAll(err); strings.Contains(out, prefix) {
		t.Errorf("a prefix of the signature in the error:\n%s", out)
	}
	if strings.Contains(logs.String(), prefix) {
		t.Errorf("a prefix of the signature in the logs:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "first_bytes") {
		t.Fatalf("no foreign-answer warning logged:\n%s", logs.String())
	}
}
