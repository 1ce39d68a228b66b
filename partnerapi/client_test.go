package partnerapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/playpipe/playpipe/internal/stacks"
	"github.com/playpipe/playpipe/schemas"
)

// Unit tests against an httptest fake; the end-to-end tests against the real
// sandbox are in e2e_test.go.

const (
	testID  = "client0001"
	testSig = "S3CRET-signature-0123456789abcdefghijklm" // 40 characters
)

// fake is a scripted partner API: the session endpoints mint tokens "tokN";
// every other request goes to data.
type fake struct {
	srv      *httptest.Server
	sessions atomic.Int32
	standby  atomic.Bool // session answers flat with the standby header
	sessWait chan struct{}
	session  http.HandlerFunc // replaces the session endpoints when set

	mu   sync.Mutex
	reqs []*http.Request
	data http.HandlerFunc
}

func newFake(t *testing.T, data http.HandlerFunc) *fake {
	t.Helper()
	f := &fake{data: data}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	f.mu.Lock()
	f.reqs = append(f.reqs, r)
	f.mu.Unlock()
	if strings.HasPrefix(r.URL.Path, "/partners/session") {
		n := f.sessions.Add(1)
		if f.session != nil {
			f.session(w, r)
			return
		}
		if f.sessWait != nil {
			<-f.sessWait
		}
		var req map[string]string
		if json.Unmarshal(body, &req) != nil || req["client_id"] != testID || req["client_signature"] != testSig {
			w.WriteHeader(400)
			fmt.Fprint(w, `{"error":true,"reason":"credentials invalid","mix":null}`)
			return
		}
		tok := fmt.Sprintf("tok%d", n)
		if f.standby.Load() {
			w.Header().Set("x-service-served-by", "standby")
			fmt.Fprintf(w, `{"session":{"token":%q}}`, tok)
			return
		}
		fmt.Fprintf(w, `{"session":{"token":{"token":%q,"error":null}}}`, tok)
		return
	}
	f.data(w, r)
}

func (f *fake) requests() []*http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*http.Request(nil), f.reqs...)
}

func (f *fake) client(t *testing.T, mod func(*Config)) *Client {
	t.Helper()
	cfg := Config{
		BaseURL:     f.srv.URL,
		Credentials: Credentials{ClientID: testID, ClientSignature: testSig},
		BaseBackoff: time.Millisecond,
		MaxBackoff:  5 * time.Millisecond,
		Logger:      discardLogger(),
	}
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestHeadersRawJWTProductAgentNoClientID(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"catalogs":[{"page_id":1,"title":"A","type":"row","ranking":1,"list_count":2}]}`)
	})
	c := f.client(t, nil)
	cats, meta, err := c.Catalog(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(cats) != 1 || cats[0].PageID != 1 || cats[0].ListCount != 2 || meta.Status != 200 || meta.ServedBy != ServedLive {
		t.Fatalf("catalog = %+v, meta %+v", cats, meta)
	}
	reqs := f.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want session + catalog", len(reqs))
	}
	for _, r := range reqs {
		if ua := r.Header.Get("User-Agent"); !strings.HasPrefix(ua, "playpipe/") || !strings.Contains(ua, "(partner integration)") {
			t.Errorf("%s: User-Agent %q", r.URL.Path, ua)
		}
		for k := range r.Header {
			if strings.Contains(strings.ToLower(k), "client") {
				t.Errorf("%s: client-id-like header %q sent", r.URL.Path, k)
			}
		}
	}
	if got := reqs[0].Header.Get("Authorization"); got != "" {
		t.Errorf("session request carries Authorization %q", got)
	}
	if got := reqs[1].Header.Get("Authorization"); got != "tok1" {
		t.Errorf("Authorization = %q, want the raw token tok1", got)
	}
}

func TestUserAgentOverride(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"catalogs":[]}`) })
	c := f.client(t, func(c *Config) { c.UserAgent = "acme-player/2.1 (partner integration)" })
	if _, _, err := c.Catalog(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, r := range f.requests() {
		if ua := r.Header.Get("User-Agent"); ua != "acme-player/2.1 (partner integration)" {
			t.Errorf("User-Agent %q", ua)
		}
	}
}

func TestStatusKinds(t *testing.T) {
	cases := []struct {
		status   int
		body     string
		header   map[string]string
		kind     Kind
		reason   string
		fields   []string
		attempts int
	}{
		{400, `{"error":true,"reason":"no results for given type","mix":null}`, nil, KindRejected, "no results for given type", nil, 1},
		{400, `{"error":true,"message":"include the required fields: playlength,country"}`, nil, KindRejected,
			"include the required fields: playlength,country", []string{"playlength", "country"}, 1},
		{401, `Unauthorized`, map[string]string{"Content-Type": "text/plain"}, KindUnauthorized, "Unauthorized", nil, 2},
		{403, `error code: 1010`, nil, KindEdgeBlocked, "edge error 1010: User-Agent blocked", nil, 1},
		{404, `{"error":true,"reason":"Mix not found","mix":null}`, nil, KindNotFound, "Mix not found", nil, 1},
		{500, `{"error":true,"reason":"internal service error","mix":null}`, nil, KindTransient, "internal service error", nil, 3},
		{503, `{"error":true,"reason":"standby upstream error"}`, map[string]string{"x-service-served-by": "standby"}, KindTransient, "standby upstream error", nil, 3},
		// Not the API's envelope (an edge's or proxy's page): never final.
		{405, ``, nil, KindTransient, "", nil, 3},
		{413, `<html><body>413 Request Entity Too Large</body></html>`, map[string]string{"Content-Type": "text/html"}, KindTransient, "<html><body>413 Request Entity Too Large</body></html>", nil, 3},
		{404, `<html>404 Not Found</html>`, nil, KindTransient, "<html>404 Not Found</html>", nil, 3},
		// Another 4xx in the API's envelope is the API's: final.
		{413, `{"error":true,"message":"request entity too large"}`, nil, KindRejected, "request entity too large", nil, 1},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.status, tc.reason), func(t *testing.T) {
			var gets atomic.Int32
			f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
				gets.Add(1)
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				fmt.Fprint(w, tc.body)
			})
			c := f.client(t, func(c *Config) { c.MaxAttempts = 3 })
			_, meta, err := c.Mix(context.Background(), 7)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v, want *Error", err)
			}
			if e.Kind != tc.kind || e.Status != tc.status || e.Reason != tc.reason || fmt.Sprint(e.Fields) != fmt.Sprint(tc.fields) {
				t.Fatalf("got kind %v status %d reason %q fields %q; want %v %d %q %q", e.Kind, e.Status, e.Reason, e.Fields, tc.kind, tc.status, tc.reason, tc.fields)
			}
			if e.Op != "GET /partners/mix/7" || meta.Status != tc.status {
				t.Errorf("op %q meta %+v", e.Op, meta)
			}
			if tc.header["x-service-served-by"] == "standby" && e.ServedBy != ServedStandby {
				t.Errorf("ServedBy %q", e.ServedBy)
			}
			if !errors.Is(err, &Error{Kind: tc.kind}) || KindOf(err) != tc.kind {
				t.Errorf("errors.Is/KindOf do not match %v", tc.kind)
			}
			if int(gets.Load()) != tc.attempts {
				t.Errorf("%d GET attempts, want %d", gets.Load(), tc.attempts)
			}
		})
	}
}

func TestTransientRetryThenSuccess(t *testing.T) {
	var n atomic.Int32
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) <= 2 {
			w.WriteHeader(500)
			fmt.Fprint(w, `{"error":true,"reason":"internal service error","mix":null}`)
			return
		}
		fmt.Fprint(w, `{"mix":{"id":7,"title":"M","tracks":[{"id":1,"time":"00:00:00","isrc":"us-abc-12-00001 "}]}}`)
	})
	c := f.client(t, nil)
	m, _, err := c.Mix(context.Background(), 7)
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != 7 || len(m.Tracks) != 1 || m.Tracks[0].ISRC != "us-abc-12-00001 " || n.Load() != 3 {
		t.Fatalf("mix %+v after %d attempts", m, n.Load())
	}
}

func TestConnectionErrorIsTransient(t *testing.T) {
	f := newFake(t, nil)
	url := f.srv.URL
	f.srv.Close()
	c, err := New(Config{BaseURL: url, Credentials: Credentials{ClientID: testID, ClientSignature: testSig},
		MaxAttempts: 2, BaseBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _, err = c.Catalog(context.Background())
	if KindOf(err) != KindTransient {
		t.Fatalf("err = %v, want transient", err)
	}
}

func TestRequestTimeoutIsTransient(t *testing.T) {
	release := make(chan struct{})
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	c := f.client(t, func(c *Config) { c.RequestTimeout = 50 * time.Millisecond; c.MaxAttempts = 1 })
	start := time.Now()
	_, _, err := c.Page(context.Background(), 1)
	if KindOf(err) != KindTransient || time.Since(start) > 5*time.Second {
		t.Fatalf("err = %v after %v, want transient timeout", err, time.Since(start))
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	var times []time.Time
	var mu sync.Mutex
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		times = append(times, time.Now())
		first := len(times) == 1
		mu.Unlock()
		if first {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(503)
			fmt.Fprint(w, `{"error":true,"reason":"standby upstream error"}`)
			return
		}
		fmt.Fprint(w, `{"page":{"id":1,"title":"P","lists":[]}}`)
	})
	// MaxBackoff 2s admits a Retry-After of 1s; the jitter alone would wait < 5ms.
	c := f.client(t, func(c *Config) { c.MaxBackoff = 2 * time.Second })
	if _, _, err := c.Page(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if len(times) != 2 {
		t.Fatalf("%d attempts", len(times))
	}
	if gap := times[1].Sub(times[0]); gap < 950*time.Millisecond {
		t.Fatalf("retried after %v, want ≥ Retry-After 1s", gap)
	}
}

func TestRetryAfterBeyondMaxBackoffReturned(t *testing.T) {
	var n atomic.Int32
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Retry-After", "120")
		w.WriteHeader(503)
	})
	c := f.client(t, nil)
	_, _, err := c.Page(context.Background(), 1)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindTransient || e.RetryAfter != 120*time.Second || n.Load() != 1 {
		t.Fatalf("err = %v (RetryAfter %v) after %d attempts; want it handed back at once", err, e.RetryAfter, n.Load())
	}
}

func TestContextBoundsRetries(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) })
	c := f.client(t, func(c *Config) {
		c.MaxAttempts = 1000
		c.BaseBackoff = 10 * time.Millisecond
		c.MaxBackoff = 20 * time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := c.List(ctx, 3)
	if KindOf(err) != KindTransient || time.Since(start) > 2*time.Second {
		t.Fatalf("err %v after %v", err, time.Since(start))
	}
}

func TestReauthOnceOn401(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "tok1" {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(401)
			fmt.Fprint(w, "Unauthorized")
			return
		}
		fmt.Fprint(w, `{"rows":{"items":null}}`)
	})
	c := f.client(t, nil)
	row, _, err := c.GenreRow(context.Background(), 9)
	if err != nil {
		t.Fatal(err)
	}
	if row.Items != nil || f.sessions.Load() != 2 {
		t.Fatalf("row %+v, %d sessions", row, f.sessions.Load())
	}
}

func TestSingleFlightRenewal(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"error":false,"message":"ok"}`) })
	f.sessWait = make(chan struct{})
	c := f.client(t, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Go(func() {
			_, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1})
			errs <- err
		})
	}
	// Let them all queue behind the one session call.
	waitFor(t, "50 callers waiting for the session call", func() bool { return stacks.BlockedIn("partnerapi.(*slot).renew(") == 50 })
	close(f.sessWait)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := f.sessions.Load(); n != 1 {
		t.Fatalf("%d session calls for 50 concurrent callers, want 1", n)
	}
}

func TestRenewBeforeExpiry(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"catalogs":[]}`) })
	clock := newFakeClock()
	c := f.client(t, func(c *Config) {
		c.LiveTokenTTL = 1500 * time.Millisecond
		c.RenewBefore = 500 * time.Millisecond
		c.Now = clock.Now
	})
	ctx := context.Background()
	if _, _, err := c.Catalog(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Add(1100 * time.Millisecond) // in the renewal window [1s, 1.5s), not expired
	if _, _, err := c.Catalog(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a background renewal before expiry", func() bool {
		return f.sessions.Load() == 2 && c.main.cur.Load().hdr[0] == "tok2"
	})
	// The call in the window used the old token (no wait), later ones the new.
	if _, _, err := c.Catalog(ctx); err != nil {
		t.Fatal(err)
	}
	var auth []string
	for _, r := range f.requests() {
		if r.URL.Path == PathCatalog {
			auth = append(auth, r.Header.Get("Authorization"))
		}
	}
	if strings.Join(auth, ",") != "tok1,tok1,tok2" {
		t.Fatalf("catalog calls used tokens %v, want [tok1 tok1 tok2]", auth)
	}
}

func TestStandbyTokenShortLived(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"catalogs":[]}`) })
	f.standby.Store(true)
	clock := newFakeClock()
	c := f.client(t, func(c *Config) { c.StandbyTokenTTL = 60 * time.Millisecond; c.Now = clock.Now })
	meta, err := c.Session(context.Background())
	if err != nil || meta.ServedBy != ServedStandby {
		t.Fatalf("Session: %+v %v", meta, err)
	}
	tok := c.main.cur.Load()
	if left := tok.expires.Sub(clock.Now()); !tok.standby || left > 60*time.Millisecond {
		t.Fatalf("standby token lives %v", left)
	}
	f.standby.Store(false)
	clock.Add(80 * time.Millisecond)
	if _, _, err := c.Catalog(context.Background()); err != nil {
		t.Fatal(err)
	}
	if t2 := c.main.cur.Load(); t2 == tok || t2.standby {
		t.Fatal("expired standby token not replaced by a live one")
	}
}

func TestReportPlayOnePOST(t *testing.T) {
	for _, status := range []int{500, 503, 400, 401, 403} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			var posts atomic.Int32
			f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
				posts.Add(1)
				w.WriteHeader(status)
				fmt.Fprint(w, `{"error":true,"message":"internal service error"}`)
			})
			c := f.client(t, nil)
			_, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1})
			if err == nil || posts.Load() != 1 {
				t.Fatalf("err %v after %d POSTs, want an error after exactly one", err, posts.Load())
			}
			if status == 401 {
				if c.main.cur.Load() != nil {
					t.Fatal("token kept after 401")
				}
				if _, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1}); KindOf(err) != KindUnauthorized {
					t.Fatal(err)
				}
				if f.sessions.Load() != 2 {
					t.Fatalf("%d sessions, want a renewal after the 401", f.sessions.Load())
				}
			}
		})
	}
}

func TestReportPlayStandbyIsNotAnError(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-service-served-by", "standby")
		fmt.Fprint(w, `{"error":false,"message":"ok"}`)
	})
	c := f.client(t, nil)
	res, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1})
	if err != nil || res.Meta.ServedBy != ServedStandby || !res.Meta.Standby() || res.Message != "ok" || res.Meta.Status != 200 || res.Latency <= 0 {
		t.Fatalf("%+v %v", res, err)
	}
}

func TestReportBodyExact(t *testing.T) {
	var got []byte
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		fmt.Fprint(w, `{"error":false,"message":"success"}`)
	})
	c := f.client(t, nil)
	zero, no := int64(0), false
	r := schemas.PlayReport{TrackID: 4711, PlayedAt: 1700000000123, PlayLength: 183, SourceStream: "mix", SourceDetail: "Run <fast> & \"far\"",
		OS: "iOS 17.4", Device: "phone", Country: "DE", Vendor: 3, UserID: "u-1", ISRC: "us-abc-12-00001 ",
		EndReason: &zero, CachedPlay: &no}
	res, err := c.ReportPlay(context.Background(), r)
	if err != nil || res.Message != "success" {
		t.Fatal(res, err)
	}
	want := `{"trackid":4711,"playedat":1700000000123,"playlength":183,"sourcestream":"mix","sourcedetail":"Run \u003cfast\u003e \u0026 \"far\"","os":"iOS 17.4","device":"phone","country":"DE","vendor":3,"userid":"u-1","isrc":"us-abc-12-00001 ","endreason":0,"cachedplay":false}`
	if string(got) != want {
		t.Fatalf("body\n got %s\nwant %s", got, want)
	}
	var back schemas.PlayReport
	if err := json.Unmarshal(got, &back); err != nil || back.ISRC != r.ISRC {
		t.Fatal(err, back.ISRC)
	}
}

func TestErrorReasonScrubsSecrets(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(400)
		fmt.Fprintf(w, `{"error":true,"reason":"bad token %s"}`, r.Header.Get("Authorization"))
	})
	f.session = func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(400)
		fmt.Fprintf(w, `{"error":true,"reason":"credentials invalid: %s"}`, strings.ReplaceAll(string(b), `"`, `'`))
	}
	c := f.client(t, nil)
	_, _, err := c.Catalog(context.Background())
	if err == nil || strings.Contains(err.Error(), testSig) || !strings.Contains(err.Error(), "[REDACTED]") {
		t.Fatalf("err = %v", err)
	}
}

func TestClosed(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {})
	c := f.client(t, nil)
	c.Close()
	c.Close()
	if _, err := c.ReportPlay(context.Background(), schemas.PlayReport{}); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if _, _, err := c.Catalog(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
}

func TestRestrictedCatalogUsesWithUserAndCountry(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"catalogs":[]}`) })
	c := f.client(t, func(c *Config) { c.Credentials.Email = "ops@example.com" })
	if _, _, err := c.RestrictedCatalog(context.Background(), "de"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.RestrictedCatalog(context.Background(), "DEU"); err == nil {
		t.Fatal("3-letter country accepted")
	}
	reqs := f.requests()
	if len(reqs) != 2 || reqs[0].URL.Path != PathSessionWithUser || reqs[1].Header.Get("EDGE-IPCountry") != "de" {
		t.Fatalf("requests: %v %v", reqs[0].URL.Path, reqs[1].Header)
	}
}

func TestReportTimeoutIsTransient(t *testing.T) {
	for _, foreign := range []bool{false, true} {
		t.Run(fmt.Sprint("foreign=", foreign), func(t *testing.T) {
			release := make(chan struct{})
			var calls atomic.Int32
			f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) > 1 {
					fmt.Fprint(w, `{"error":false,"message":"ok"}`)
					return
				}
				select {
				case <-release:
				case <-r.Context().Done():
				}
			})
			defer close(release)
			c := f.client(t, func(c *Config) {
				c.RequestTimeout = 100 * time.Millisecond
				if foreign {
					c.HTTPClient = &http.Client{}
				}
			})
			start := time.Now()
			_, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1})
			if KindOf(err) != KindTransient || time.Since(start) > 5*time.Second {
				t.Fatalf("err = %v after %v, want a transient timeout", err, time.Since(start))
			}
			// A healthy answer through the same path still works.
			if res, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1}); err != nil || res.Message != "ok" {
				t.Fatal(res, err)
			}
		})
	}
}

func TestBackgroundRenewalBacksOffWhenSessionsFail(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"error":false,"message":"ok"}`) })
	var fail atomic.Bool
	f.session = func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			w.WriteHeader(500)
			return
		}
		fmt.Fprint(w, `{"session":{"token":{"token":"tokA","error":null}}}`)
	}
	clock := newFakeClock()
	c := f.client(t, func(c *Config) {
		c.LiveTokenTTL = 3 * time.Second
		c.RenewBefore = time.Second
		c.MaxAttempts = 1
		c.Now = clock.Now
	})
	if _, err := c.Session(context.Background()); err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	clock.Add(2100 * time.Millisecond) // in the renewal window
	before := f.sessions.Load()
	for range 300 {
		if _, err := c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1}); err != nil {
			t.Fatal(err) // the old token is still valid: reports go on
		}
	}
	if n := f.sessions.Load() - before; n < 1 || n > 2 {
		t.Fatalf("%d session calls during 300 reports with a failing session endpoint, want 1 (then back off)", n)
	}
}

// fakeClock is Config.Now for tests: time moves only when Add is called.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1767225600, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// waitFor polls cond (work in background goroutines) for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestErrorEndpoint: every *Error names its endpoint (Error.Endpoint), the
// field callers decide on instead of Error.Op's text: a session refusing
// the credentials, a GET's 404 and a play report's 400.
func TestErrorEndpoint(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == PathRoyaltyTracking {
			w.WriteHeader(400)
			fmt.Fprint(w, `{"error":true,"message":"include the required fields: isrc"}`)
			return
		}
		w.WriteHeader(404)
		fmt.Fprint(w, `{"error":true,"reason":"mix not found","mix":null}`)
	})
	c := f.client(t, func(c *Config) { c.MaxAttempts = 1 })
	_, _, err := c.Mix(context.Background(), 7)
	var e *Error
	if !errors.As(err, &e) || e.Endpoint != EndpointMix || e.Endpoint.Session() || e.Endpoint.String() != "GET /partners/mix/{id}" {
		t.Fatalf("mix: %v (endpoint %v)", err, e.Endpoint)
	}
	_, err = c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1})
	if !errors.As(err, &e) || e.Endpoint != EndpointReport || e.Kind != KindRejected {
		t.Fatalf("report: %v (endpoint %v)", err, e.Endpoint)
	}
	bad := f.client(t, func(c *Config) { c.MaxAttempts = 1; c.Credentials.ClientSignature = "wrong-signature" })
	_, _, err = bad.Mix(context.Background(), 7)
	if !errors.As(err, &e) || e.Endpoint != EndpointSession || !e.Endpoint.Session() || e.Kind != KindRejected {
		t.Fatalf("session: %v (endpoint %v)", err, e.Endpoint)
	}
}
