package partnerapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// End-to-end tests: the client against the real sandbox over HTTP on loopback.

// recorder is a RoundTripper that keeps the headers of every request the
// client sends, and may rewrite a request first (to reach error cases the
// typed API cannot produce, such as a missing path id).
type recorder struct {
	next    http.RoundTripper
	mu      sync.Mutex
	headers []http.Header
	paths   []string
	rewrite func(*http.Request)
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.headers = append(r.headers, req.Header.Clone())
	r.paths = append(r.paths, req.URL.Path)
	rw := r.rewrite
	r.mu.Unlock()
	if rw != nil {
		req = req.Clone(req.Context())
		rw(req)
	}
	return r.next.RoundTrip(req)
}

func (r *recorder) setRewrite(f func(*http.Request)) {
	r.mu.Lock()
	r.rewrite = f
	r.mu.Unlock()
}

type env struct {
	sb  *testenv.Sandbox
	c   *partnerapi.Client
	rec *recorder
}

func start(t testing.TB, mod func(*partnerapi.Config), opts ...func(*sandbox.Config)) *env {
	t.Helper()
	sb := testenv.StartSandbox(t, opts...)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	t.Cleanup(tr.CloseIdleConnections)
	rec := &recorder{next: tr}
	cfg := partnerapi.Config{
		BaseURL:     sb.URL,
		Credentials: partnerapi.Credentials{ClientID: sb.ClientID, ClientSignature: sb.ClientSignature},
		HTTPClient:  &http.Client{Transport: rec},
		BaseBackoff: time.Millisecond,
		MaxBackoff:  10 * time.Millisecond,
		Logger:      slog.New(slog.DiscardHandler),
	}
	if mod != nil {
		mod(&cfg)
	}
	c, err := partnerapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &env{sb: sb, c: c, rec: rec}
}

func (e *env) count(endpoint string, status int) int64 {
	return e.sb.Ledger().Counters[endpoint][status]
}

func wantErr(t *testing.T, err error, kind partnerapi.Kind, status int, reason string) *partnerapi.Error {
	t.Helper()
	var e *partnerapi.Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v, want *partnerapi.Error of kind %v", err, kind)
	}
	if e.Kind != kind || e.Status != status || (reason != "" && e.Reason != reason) {
		t.Fatalf("err = %v (kind %v, status %d, reason %q); want %v %d %q", err, e.Kind, e.Status, e.Reason, kind, status, reason)
	}
	return e
}

func TestE2EEveryEndpointLive(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	cat := e.sb.Catalog()

	entries, meta, err := e.c.Catalog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Status != 200 || meta.ServedBy != partnerapi.ServedLive || len(entries) == 0 {
		t.Fatalf("catalog meta %+v, %d entries", meta, len(entries))
	}
	for _, ce := range entries {
		p, ok := cat.Page(ce.PageID)
		if !ok || p.Title != ce.Title || p.Type != ce.Type || ce.ListCount != len(p.Lists) {
			t.Fatalf("catalog entry %+v does not match the sandbox's page %+v", ce, p)
		}
	}

	var sawMixes int
	for _, p := range cat.Pages {
		if len(p.Lists) == 0 {
			continue
		}
		page, meta, err := e.c.Page(ctx, p.ID)
		if err != nil || meta.Status != 200 {
			t.Fatal(err)
		}
		if page.ID != p.ID || len(page.Lists) != len(p.Lists) {
			t.Fatalf("page %d: %+v", p.ID, page)
		}
		for _, pl := range page.Lists {
			want, _ := cat.List(pl.ListID)
			if pl.MixCount != want.MixCount || pl.Image.Thumbnail == "" {
				t.Fatalf("page list %+v, want mix_count %d", pl, want.MixCount)
			}
			if len(want.MixIDs) == 0 {
				_, _, err := e.c.List(ctx, pl.ListID)
				wantErr(t, err, partnerapi.KindRejected, 400, "no results for given type")
				continue
			}
			l, _, err := e.c.List(ctx, pl.ListID)
			if err != nil {
				t.Fatal(err)
			}
			if len(l.Mixes) != len(want.MixIDs) {
				t.Fatalf("list %d: %d mixes, want %d", pl.ListID, len(l.Mixes), len(want.MixIDs))
			}
			for i, s := range l.Mixes {
				m, _ := cat.Mix(want.MixIDs[i])
				if s.ID != m.ID || s.BPM != m.BPM || s.MaxBPM != m.MaxBPM || s.ListID != pl.ListID || bool(s.Explicit) != m.Explicit || s.Length != m.Length() || s.DJ != nil {
					t.Fatalf("live summary %+v, want mix %+v", s, m)
				}
			}
			sawMixes += len(l.Mixes)
		}
		row, _, err := e.c.GenreRow(ctx, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		if want := cat.Genres[p.ID]; len(row.Items) != len(want.Items) {
			t.Fatalf("genre row %d: %d items, want %d", p.ID, len(row.Items), len(want.Items))
		}
	}
	if sawMixes == 0 {
		t.Fatal("no list had mixes")
	}
	// The page without content: page 400, genre row items null.
	last := cat.Pages[len(cat.Pages)-1]
	_, _, err = e.c.Page(ctx, last.ID)
	wantErr(t, err, partnerapi.KindRejected, 400, "no results for given type")
	row, _, err := e.c.GenreRow(ctx, last.ID)
	if err != nil || row.Items != nil {
		t.Fatalf("empty genre row: %+v %v", row, err)
	}

	// Every mix: tracks and ISRCs byte for byte (lowercase, hyphenated,
	// trailing-space and shared ISRCs included).
	for _, want := range cat.Mixes {
		m, meta, err := e.c.Mix(ctx, want.ID)
		if err != nil || meta.ServedBy != partnerapi.ServedLive {
			t.Fatal(err)
		}
		if m.ID != want.ID || m.Title != want.Title || m.Length != want.Length() || m.MinBPM != want.MinBPM || m.MaxBPM != want.MaxBPM ||
			bool(m.Explicit) != want.Explicit || m.DJ.Name != want.DJ.Name || len(m.Tracks) != len(want.Tracks) || m.IOSHLSURL != want.IOSHLSURL {
			t.Fatalf("mix %d: %+v", want.ID, m)
		}
		for i, tr := range m.Tracks {
			if tr.ID != want.Tracks[i].ID || tr.ISRC != want.Tracks[i].ISRC || tr.Time != want.Tracks[i].Time {
				t.Fatalf("mix %d track %d: %+v, want %+v", want.ID, i, tr, want.Tracks[i])
			}
		}
	}
	_, _, err = e.c.Mix(ctx, 1)
	wantErr(t, err, partnerapi.KindNotFound, 404, "Mix not found")

	// Restricted catalog without an e-mail: the plain session's token falls
	// back to the unrestricted catalog.
	rc, _, err := e.c.RestrictedCatalog(ctx, "DE")
	if err != nil || len(rc) != len(entries) {
		t.Fatalf("restricted without identity: %d entries (want %d), %v", len(rc), len(entries), err)
	}

	// One session for all of it, and the raw JWT on every data call.
	if n := e.count("session", 200); n != 1 {
		t.Fatalf("%d sessions", n)
	}
	checkHeaders(t, e.rec, e.sb.ClientID)
}

// checkHeaders: product User-Agent, raw JWT (never "Bearer "), no client-id header.
func checkHeaders(t *testing.T, rec *recorder, clientID string) {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.headers) == 0 {
		t.Fatal("no requests recorded")
	}
	for i, h := range rec.headers {
		path := rec.paths[i]
		if !strings.HasPrefix(h.Get("User-Agent"), "playpipe/") {
			t.Fatalf("%s: User-Agent %q", path, h.Get("User-Agent"))
		}
		auth := h.Get("Authorization")
		if strings.HasPrefix(path, "/partners/session") {
			if auth != "" {
				t.Fatalf("%s carries Authorization", path)
			}
		} else if auth == "" || strings.Contains(strings.ToLower(auth), "bearer") || strings.Count(auth, ".") != 2 {
			t.Fatalf("%s: Authorization %q is not a raw JWT", path, auth)
		}
		for k, v := range h {
			if strings.Contains(strings.ToLower(k), "client") || (k != "Authorization" && strings.Contains(strings.Join(v, ","), clientID)) {
				t.Fatalf("%s: client id sent in header %s", path, k)
			}
		}
	}
}

func TestE2ERestrictedCatalogWithUser(t *testing.T) {
	e := start(t, func(c *partnerapi.Config) { c.Credentials.Email = "integration@playpipe.example" })
	ctx := context.Background()
	cat := e.sb.Catalog()
	for _, country := range []string{"", "DE", "us"} {
		got, _, err := e.c.RestrictedCatalog(ctx, country)
		if err != nil {
			t.Fatal(country, err)
		}
		want := cat.RestrictedPages(country)
		if len(got) != len(want) {
			t.Fatalf("country %q: %d pages, want %d", country, len(got), len(want))
		}
	}
	_, _, err := e.c.RestrictedCatalog(ctx, "CN")
	wantErr(t, err, partnerapi.KindRejected, 400, "no catalogs available for this partner")
	if e.count("session_with_user", 200) != 1 || e.count("session", 200) != 0 {
		t.Fatalf("sessions: %v", e.sb.Ledger().Counters)
	}
	// Other endpoints keep the plain session.
	if _, _, err := e.c.Catalog(ctx); err != nil || e.count("session", 200) != 1 {
		t.Fatal(err, e.sb.Ledger().Counters)
	}

	// An e-mail the sandbox does not know: 400 partner not found.
	bad := start(t, func(c *partnerapi.Config) { c.Credentials.Email = "someone@else.example" })
	_, _, err = bad.c.RestrictedCatalog(ctx, "")
	wantErr(t, err, partnerapi.KindRejected, 400, "partner not found")
}

func TestE2ESessionErrors(t *testing.T) {
	ctx := context.Background()
	e := start(t, func(c *partnerapi.Config) { c.Credentials.ClientSignature = strings.Repeat("x", 40) })
	_, err := e.c.Session(ctx)
	wantErr(t, err, partnerapi.KindRejected, 400, "credentials invalid")
	_, _, err = e.c.Mix(ctx, 30000)
	wantErr(t, err, partnerapi.KindRejected, 400, "credentials invalid")

	// Credentials missing from the body (the client refuses to send empty
	// ones, so the request is rewritten on the wire): 401 JSON envelope.
	e = start(t, nil)
	e.rec.setRewrite(func(r *http.Request) {
		r.Body = io.NopCloser(strings.NewReader(`{}`))
		r.ContentLength = 2
	})
	_, err = e.c.Session(ctx)
	wantErr(t, err, partnerapi.KindUnauthorized, 401, "please provide user information to create session: email, salt")

	// 500 on the session endpoint: transient, retried up to MaxAttempts.
	e = start(t, func(c *partnerapi.Config) { c.MaxAttempts = 3 })
	e.sb.SetFaults(sandbox.Faults{Session: sandbox.GroupFaults{FailNext: 2}})
	if _, _, err := e.c.Catalog(ctx); err != nil {
		t.Fatal(err)
	}
	if e.count("session", 500) != 2 || e.count("session", 200) != 1 {
		t.Fatalf("counters %v", e.sb.Ledger().Counters)
	}
}

func TestE2EMissingIDReasons(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	strip := func(r *http.Request) {
		if i := strings.LastIndexByte(r.URL.Path, '/'); i > 0 && !strings.HasPrefix(r.URL.Path, "/partners/session") {
			r.URL.Path = r.URL.Path[:i+1]
		}
	}
	e.rec.setRewrite(strip)
	_, _, err := e.c.GenreRow(ctx, 100)
	wantErr(t, err, partnerapi.KindRejected, 400, "please provide a music row id as a URL parameter")
	_, _, err = e.c.Mix(ctx, 30000)
	wantErr(t, err, partnerapi.KindRejected, 400, "Please provide a mix ID as a URL parameter")
	_, _, err = e.c.Page(ctx, 100)
	wantErr(t, err, partnerapi.KindRejected, 400, "no results for given type")
	_, _, err = e.c.List(ctx, 2000)
	wantErr(t, err, partnerapi.KindRejected, 400, "no results for given type")
}

func TestE2EEmptyCatalog(t *testing.T) {
	e := start(t, nil, func(o *sandbox.Config) { o.EmptyCatalog = true })
	_, _, err := e.c.Catalog(context.Background())
	wantErr(t, err, partnerapi.KindRejected, 400, "no catalogs available")
}

func TestE2EEdgeBlocksLibraryAgents(t *testing.T) {
	for _, ua := range []string{"Go-http-client/1.1", "curl/8.5.0", "python-requests/2.31"} {
		e := start(t, func(c *partnerapi.Config) { c.UserAgent = ua })
		_, _, err := e.c.Catalog(context.Background())
		wantErr(t, err, partnerapi.KindEdgeBlocked, 403, "")
		if !errors.Is(err, partnerapi.ErrEdgeBlocked) {
			t.Fatal("errors.Is ErrEdgeBlocked")
		}
		_, err = e.c.ReportPlay(context.Background(), schemas.PlayReport{TrackID: 1})
		wantErr(t, err, partnerapi.KindEdgeBlocked, 403, "")
	}
}

// goodReport is a valid report for track i of the mix.
func goodReport(m *sandbox.Mix, i int) schemas.PlayReport {
	tr := m.Tracks[i]
	no, reason := false, int64(0)
	return schemas.PlayReport{TrackID: tr.ID, PlayedAt: 1_700_000_000_000 + int64(i)*1000, PlayLength: int64(min(tr.LengthSec, 30)),
		SourceStream: "mix", SourceDetail: m.Title, OS: "iOS 17.4", Device: "phone", Country: "DE", Vendor: 7,
		UserID: "user-1", ISRC: tr.ISRC, EndReason: &reason, CachedPlay: &no}
}

func TestE2EReportPlay(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	cat := e.sb.Catalog()
	var sent [][]byte
	// One report per ISRC quirk: the ISRC must arrive byte for byte.
	for _, q := range []sandbox.ISRCQuirk{sandbox.QuirkNone, sandbox.QuirkLowercase, sandbox.QuirkHyphenated, sandbox.QuirkTrailingSpace, sandbox.QuirkShared} {
		tracks := cat.TracksWithQuirk(q)
		if len(tracks) == 0 {
			t.Fatalf("sandbox has no %q ISRC", q)
		}
		m, i, _ := cat.MixContaining(tracks[0].ID)
		r := goodReport(m, i)
		res, err := e.c.ReportPlay(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if res.Meta.Status != 200 || res.Meta.ServedBy != partnerapi.ServedLive || res.Message != "success" || res.Latency <= 0 {
			t.Fatalf("%+v", res)
		}
		sent = append(sent, schemas.AppendReportJSON(nil, &r))
	}
	l := e.sb.Ledger()
	if len(l.Accepted) != len(sent) {
		t.Fatalf("%d accepted, want %d", len(l.Accepted), len(sent))
	}
	for i, a := range l.Accepted {
		if a.Raw != string(sent[i]) || len(a.Flags) != 0 || a.Duplicate {
			t.Fatalf("ledger entry %d: raw %s flags %v dup %v; sent %s", i, a.Raw, a.Flags, a.Duplicate, sent[i])
		}
		if *a.Report.EndReason != 0 || *a.Report.CachedPlay || a.Report.JumpForward != nil {
			t.Fatalf("optional fields: %+v", a.Report)
		}
	}

	// 400 with the offending fields, parsed.
	res, err := e.c.ReportPlayJSON(ctx, []byte(`{"trackid":1,"playedat":1700000000000,"sourcestream":"mix","sourcedetail":"x","os":"a","device":"b","vendor":1}`))
	pe := wantErr(t, err, partnerapi.KindRejected, 400, "")
	if fmt.Sprint(pe.Fields) != "[playlength country]" || !strings.HasPrefix(pe.Reason, "include the required fields:") || res.Meta.Status != 0 {
		t.Fatalf("fields %q reason %q", pe.Fields, pe.Reason)
	}
	_, err = e.c.ReportPlayJSON(ctx, []byte(`{"trackid":"1","playedat":1.0}`))
	pe = wantErr(t, err, partnerapi.KindRejected, 400, "")
	if len(pe.Fields) < 2 || pe.Fields[0] != "trackid" {
		t.Fatalf("fields %q", pe.Fields)
	}

	// 500: transient, exactly one POST (the reporter owns retries).
	e.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{FailNext: 1}})
	before := e.count("report", 500)
	_, err = e.c.ReportPlay(ctx, goodReport(&cat.Mixes[0], 0))
	wantErr(t, err, partnerapi.KindTransient, 500, "internal service error")
	if e.count("report", 500) != before+1 {
		t.Fatal("not exactly one POST")
	}
	// 401 from the auth layer: token dropped, next call renews (one session).
	e.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{FailNext: 1, FailNextStatus: 401}})
	_, err = e.c.ReportPlay(ctx, goodReport(&cat.Mixes[0], 0))
	wantErr(t, err, partnerapi.KindUnauthorized, 401, "Unauthorized")
	if _, err := e.c.ReportPlay(ctx, goodReport(&cat.Mixes[0], 1)); err != nil {
		t.Fatal(err)
	}
	if e.count("session", 200) != 2 {
		t.Fatalf("sessions %v", e.sb.Ledger().Counters["session"])
	}
	checkHeaders(t, e.rec, e.sb.ClientID)
}

func TestE2ETransientRetriesAndTimeout(t *testing.T) {
	e := start(t, func(c *partnerapi.Config) { c.MaxAttempts = 3 })
	ctx := context.Background()
	id := e.sb.Catalog().Mixes[0].ID
	e.sb.SetFaults(sandbox.Faults{Mix: sandbox.GroupFaults{FailNext: 2, FailNextStatus: 503}})
	if _, _, err := e.c.Mix(ctx, id); err != nil {
		t.Fatal(err)
	}
	if e.count("mix", 503) != 2 || e.count("mix", 200) != 1 {
		t.Fatalf("counters %v", e.sb.Ledger().Counters["mix"])
	}
	e.sb.SetFaults(sandbox.Faults{Catalog: sandbox.GroupFaults{FailNext: 5}})
	_, _, err := e.c.Catalog(ctx)
	wantErr(t, err, partnerapi.KindTransient, 500, "internal service error")
	if e.count("catalog", 500) != 3 {
		t.Fatalf("%d attempts, want MaxAttempts=3", e.count("catalog", 500))
	}
	// 401 on a GET: one new session and a retry, transparently.
	e.sb.SetFaults(sandbox.Faults{Catalog: sandbox.GroupFaults{FailNext: 1, FailNextStatus: 401}})
	if _, _, err := e.c.Catalog(ctx); err != nil {
		t.Fatal(err)
	}
	if e.count("session", 200) != 2 {
		t.Fatalf("sessions %v", e.sb.Ledger().Counters["session"])
	}

	// Added latency beyond RequestTimeout: a transient timeout.
	slow := start(t, func(c *partnerapi.Config) { c.RequestTimeout = 100 * time.Millisecond; c.MaxAttempts = 1 })
	if _, err := slow.c.Session(ctx); err != nil {
		t.Fatal(err)
	}
	slow.sb.SetFaults(sandbox.Faults{Mix: sandbox.GroupFaults{Latency: 2 * time.Second}})
	_, _, err = slow.c.Mix(ctx, id)
	if e := wantErr(t, err, partnerapi.KindTransient, 0, ""); !errors.Is(e, context.DeadlineExceeded) {
		t.Fatalf("timeout error %v does not wrap DeadlineExceeded", e)
	}
}

func TestE2EStandbySwitch(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	cat := e.sb.Catalog()
	listID := cat.Pages[0].Lists[0].ID
	mix := &cat.Mixes[0]

	if _, _, err := e.c.List(ctx, listID); err != nil { // live token
		t.Fatal(err)
	}
	e.sb.SetMode(sandbox.ModeStandby)

	// Standby shapes: list summaries with boolean explicit, min/max bpm, dj, artwork.
	l, meta, err := e.c.List(ctx, listID)
	if err != nil {
		t.Fatal(err)
	}
	if meta.ServedBy != partnerapi.ServedStandby || !meta.Standby() {
		t.Fatalf("meta %+v", meta)
	}
	for _, s := range l.Mixes {
		if s.DJ == nil || s.DJ.Name == "" || s.MinBPM == 0 || s.BPM != 0 || s.ListID != 0 || s.ImageLarge == "" || s.RepresentativeBPM() == 0 {
			t.Fatalf("standby summary %+v", s)
		}
	}
	m, meta, err := e.c.Mix(ctx, mix.ID)
	if err != nil || meta.ServedBy != partnerapi.ServedStandby || len(m.Tracks) != len(mix.Tracks) || m.AndroidHLSURL+m.HLSURL+m.IOSHLSURL+m.URL == "" {
		t.Fatalf("standby mix %+v %v", meta, err)
	}

	// The reporter's probe: a standby session (flat shape), short-lived token.
	meta, err = e.c.Session(ctx)
	if err != nil || meta.ServedBy != partnerapi.ServedStandby {
		t.Fatalf("probe %+v %v", meta, err)
	}
	res, err := e.c.ReportPlay(ctx, goodReport(mix, 0))
	if err != nil || res.Meta.ServedBy != partnerapi.ServedStandby {
		t.Fatalf("standby report %+v %v", res, err)
	}
	if l := e.sb.Ledger(); l.StandbyCount != 1 || l.AcceptedCount != 0 {
		t.Fatalf("ledger standby %d accepted %d", l.StandbyCount, l.AcceptedCount)
	}

	// Back to live: the standby token dies. Many goroutines GET at once:
	// each gets 401, and one session call renews for all of them.
	e.sb.SetMode(sandbox.ModeLive)
	sessionsBefore := e.count("session", 200)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		wg.Go(func() {
			l, meta, err := e.c.List(ctx, listID)
			if err == nil && (meta.ServedBy != partnerapi.ServedLive || l.Mixes[0].DJ != nil || l.Mixes[0].BPM == 0) {
				err = fmt.Errorf("goroutine %d: live shape expected, got %+v", i, meta)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := e.count("session", 200) - sessionsBefore; n != 1 {
		t.Fatalf("%d session calls after standby ended, want 1 (single flight)", n)
	}
	if e.count("list", 401) == 0 {
		t.Fatal("the standby token was never rejected: the test did not test renewal")
	}
	// Reports flow again, live.
	res, err = e.c.ReportPlay(ctx, goodReport(mix, 1))
	if err != nil || res.Meta.ServedBy != partnerapi.ServedLive {
		t.Fatalf("%+v %v", res, err)
	}
	checkHeaders(t, e.rec, e.sb.ClientID)
}

func TestE2EStandbyTokenDiesForReports(t *testing.T) {
	e := start(t, nil, func(o *sandbox.Config) { o.Mode = sandbox.ModeStandby })
	ctx := context.Background()
	mix := &e.sb.Catalog().Mixes[0]
	if _, err := e.c.ReportPlay(ctx, goodReport(mix, 0)); err != nil {
		t.Fatal(err)
	}
	e.sb.SetMode(sandbox.ModeLive)
	// One POST per call: the dead token gives 401 to the caller (who retries).
	_, err := e.c.ReportPlay(ctx, goodReport(mix, 0))
	wantErr(t, err, partnerapi.KindUnauthorized, 401, "Unauthorized")
	res, err := e.c.ReportPlay(ctx, goodReport(mix, 0))
	if err != nil || res.Meta.ServedBy != partnerapi.ServedLive {
		t.Fatalf("%+v %v", res, err)
	}
	if l := e.sb.Ledger(); l.AcceptedCount != 1 || l.StandbyCount != 1 {
		t.Fatalf("ledger %d/%d", l.AcceptedCount, l.StandbyCount)
	}
}

func TestE2ELiveBypass(t *testing.T) {
	e := start(t, nil, func(o *sandbox.Config) { o.Mode = sandbox.ModeLiveBypass })
	ctx := context.Background()
	_, meta, err := e.c.Catalog(ctx)
	if err != nil || meta.ServedBy != partnerapi.ServedLiveBypass {
		t.Fatalf("%+v %v", meta, err)
	}
	res, err := e.c.ReportPlay(ctx, goodReport(&e.sb.Catalog().Mixes[0], 0))
	if err != nil || res.Meta.ServedBy != partnerapi.ServedLiveBypass || e.sb.Ledger().AcceptedCount != 1 {
		t.Fatalf("%+v %v", res, err)
	}
}

func TestE2ESingleFlightFirstSession(t *testing.T) {
	e := start(t, nil)
	mix := &e.sb.Catalog().Mixes[0]
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			if _, err := e.c.ReportPlay(context.Background(), goodReport(mix, 0)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := e.count("session", 200); n != 1 {
		t.Fatalf("%d sessions for 64 concurrent first calls, want 1", n)
	}
	if l := e.sb.Ledger(); l.AcceptedCount != 64 || l.Duplicates != 63 {
		t.Fatalf("accepted %d duplicates %d", l.AcceptedCount, l.Duplicates)
	}
}

func TestE2ETokenExpiryRenewal(t *testing.T) {
	// The sandbox mints 3 s tokens; the client reads exp and renews ahead.
	e := start(t, nil, func(o *sandbox.Config) { o.LiveTokenTTL = 3 * time.Second })
	ctx := context.Background()
	deadline := time.Now().Add(4500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if _, _, err := e.c.Catalog(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if e.count("catalog", 401) != 0 {
		t.Fatalf("the client let a token expire: %v", e.sb.Ledger().Counters["catalog"])
	}
	if n := e.count("session", 200); n < 2 {
		t.Fatalf("%d sessions in 4.5 s with 3 s tokens", n)
	}
}

// TestE2ENoSecretsInLogs runs a session lifecycle against the sandbox with a
// debug logger and checks the output for the signature and every token.
func TestE2ENoSecretsInLogs(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	e := start(t, func(c *partnerapi.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	ctx := context.Background()
	if _, _, err := e.c.Catalog(ctx); err != nil {
		t.Fatal(err)
	}
	e.sb.SetMode(sandbox.ModeStandby)
	if _, err := e.c.Session(ctx); err != nil {
		t.Fatal(err)
	}
	e.sb.SetMode(sandbox.ModeLive)
	_, _, _ = e.c.Catalog(ctx)
	e.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{FailNext: 1}})
	_, err := e.c.ReportPlay(ctx, schemas.PlayReport{TrackID: 1})
	out := logs.String() + fmt.Sprintf("%v %+v %#v", err, err, err)
	if strings.Contains(out, e.sb.ClientSignature) {
		t.Fatalf("signature leaked:\n%s", out)
	}
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	for _, h := range e.rec.headers {
		if tok := h.Get("Authorization"); tok != "" && strings.Contains(out, tok) {
			t.Fatalf("token leaked:\n%s", out)
		}
	}
	if !strings.Contains(logs.String(), "session created") {
		t.Fatalf("no session logs:\n%s", logs.String())
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestE2ESessionWithUserErrors(t *testing.T) {
	ctx := context.Background()
	e := start(t, func(c *partnerapi.Config) {
		c.Credentials.Email = "integration@playpipe.example"
		c.Credentials.ClientSignature = strings.Repeat("y", 40)
	})
	_, _, err := e.c.RestrictedCatalog(ctx, "")
	wantErr(t, err, partnerapi.KindRejected, 400, "credentials invalid")

	e = start(t, func(c *partnerapi.Config) { c.Credentials.Email = "integration@playpipe.example" })
	e.rec.setRewrite(func(r *http.Request) {
		if r.URL.Path == partnerapi.PathSessionWithUser {
			r.Body = io.NopCloser(strings.NewReader(`{"email":"integration@playpipe.example"}`))
			r.ContentLength = -1
		}
	})
	_, _, err = e.c.RestrictedCatalog(ctx, "")
	wantErr(t, err, partnerapi.KindUnauthorized, 401, "please provide user information to create session: email, client_id, client_signature")
}

func TestE2EStandbyUpstreamError(t *testing.T) {
	e := start(t, nil, func(o *sandbox.Config) { o.Mode = sandbox.ModeStandby })
	ctx := context.Background()
	mix := &e.sb.Catalog().Mixes[0]
	if _, err := e.c.Session(ctx); err != nil {
		t.Fatal(err)
	}
	e.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{FailNext: 1, FailNextStatus: 503}, Mix: sandbox.GroupFaults{FailNext: 1, FailNextStatus: 503}})
	_, err := e.c.ReportPlay(ctx, goodReport(mix, 0))
	pe := wantErr(t, err, partnerapi.KindTransient, 503, "standby upstream error")
	if pe.ServedBy != partnerapi.ServedStandby {
		t.Fatalf("ServedBy %q", pe.ServedBy)
	}
	// GETs retry the standby 503 by themselves.
	if _, meta, err := e.c.Mix(ctx, mix.ID); err != nil || !meta.Standby() || e.count("mix", 503) != 1 {
		t.Fatalf("%+v %v %v", meta, err, e.sb.Ledger().Counters["mix"])
	}
}

// TestE2ECatalogOrderAgainstStrictSandbox: the strict sandbox shuffles every
// ranked collection; the client's helpers give the sandbox's display order.
func TestE2ECatalogOrderAgainstStrictSandbox(t *testing.T) {
	e := start(t, func(c *partnerapi.Config) { c.Credentials.Email = sandbox.DefaultEmail })
	ctx := context.Background()
	cat := e.sb.Catalog()
	if !cat.Strict {
		t.Fatal("the test sandbox is not strict")
	}
	byRank := func(ids []int64, rank func(int64) int) []int64 {
		out := slices.Clone(ids)
		slices.SortFunc(out, func(a, b int64) int { return rank(a) - rank(b) })
		return out
	}
	pageRank := func(id int64) int { p, _ := cat.Page(id); return p.Ranking }
	for _, restricted := range []bool{false, true} {
		var entries []partnerapi.CatalogEntry
		var err error
		var want []int64
		if restricted {
			entries, _, err = e.c.RestrictedCatalog(ctx, "")
			for _, p := range cat.RestrictedPages("") {
				want = append(want, p.ID)
			}
		} else {
			entries, _, err = e.c.Catalog(ctx)
			for _, p := range cat.Pages {
				want = append(want, p.ID)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		want = byRank(want, pageRank)
		var got []int64
		for _, ce := range entries {
			got = append(got, ce.PageID)
		}
		if !slices.Equal(got, want) || slices.IsSorted(got) {
			t.Fatalf("restricted=%v: catalog %v, want display order %v (not id order)", restricted, got, want)
		}
	}
	for _, p := range cat.Pages {
		if len(p.Lists) < 2 {
			continue
		}
		page, _, err := e.c.Page(ctx, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		var got, want []int64
		for _, l := range page.Lists {
			got = append(got, l.ListID)
		}
		for _, l := range p.Lists {
			want = append(want, l.ID)
		}
		want = byRank(want, func(id int64) int { l, _ := cat.List(id); return l.Ranking })
		if !slices.Equal(got, want) {
			t.Fatalf("page %d lists %v, want %v", p.ID, got, want)
		}
		row, _, err := e.c.GenreRow(ctx, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		items := cat.Genres[p.ID].Items
		want = want[:0]
		for _, it := range items {
			want = append(want, it.ID)
		}
		ord := func(id int64) int {
			return items[slices.IndexFunc(items, func(g sandbox.GenreItem) bool { return g.ID == id })].Ordering
		}
		want = byRank(want, ord)
		got = got[:0]
		for _, it := range row.Items {
			got = append(got, it.ID)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("genre row %d: %v, want %v", p.ID, got, want)
		}
	}
	// An unknown genre row is an error, not an empty row.
	_, _, err := e.c.GenreRow(ctx, 987654321)
	wantErr(t, err, partnerapi.KindRejected, 400, "no results for given type")
}
