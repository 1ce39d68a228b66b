package analytics

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestHTMLReportRendersInChromium writes the HTML page of the fixture's
// ledger and renders it in headless Chromium: the page must load with no
// script error or console error, every chart must have a size, and a
// screenshot must be produced. A page with a script error must be caught (the
// check can fail). Without Chromium the test skips, unless
// PLAYPIPE_REQUIRE_CHROMIUM=1 (make test, which installs it).
func TestHTMLReportRendersInChromium(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	want := fixture(t, e, now)
	s := e.startSink(t, e.cfg)
	a := e.auditor(t)
	opts := AuditOptions{From: now.Add(-2 * time.Hour), To: now.Add(time.Minute), PendingThreshold: 10 * time.Minute, Now: now}
	var r *Audit
	waitFor(t, 30*time.Second, "the audit to match", func() (bool, string) {
		var err error
		r, err = a.Audit(context.Background(), opts)
		if err != nil {
			return false, err.Error()
		}
		return reflect.DeepEqual(numbers(r), want), fmt.Sprintf("%+v", numbers(r))
	})
	if err := s.stop(t); err != nil {
		t.Fatal(err)
	}
	h, err := a.HTML(context.Background(), opts, r, 100)
	if err != nil {
		t.Fatal(err)
	}
	var page bytes.Buffer
	if err := WriteHTML(&page, h); err != nil {
		t.Fatal(err)
	}
	html := page.String()

	// The same numbers and verdict as the table, the ids behind them, no network.
	var table bytes.Buffer
	if err := WriteAudit(&table, r, FormatTable); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"RESULT: FAIL: " + strings.Join(r.Problems(), "; "), `href="#list-delivered-twice"`, `id="list-delivered-twice"`,
		`id="list-pending-overdue"`, "isrc is invalid", "trace-r3b", "<svg", "standby episode"} {
		if !strings.Contains(html, escaped(want)) {
			t.Errorf("page lacks %q", want)
		}
	}
	if !strings.Contains(table.String(), "RESULT: FAIL: "+strings.Join(r.Problems(), "; ")) {
		t.Error("table and page verdicts differ")
	}
	if bad := fetches(html); len(bad) > 0 {
		t.Errorf("page is not self-contained: it contains %q", bad)
	}
	if len(h.Series) == 0 || len(h.Episodes) != 1 || h.Episodes[0].Answers != 1 {
		t.Errorf("series %d points, episodes %+v: want points and one standby episode of one answer", len(h.Series), h.Episodes)
	}

	browser := chromium(t)
	dir := t.TempDir()
	pagePath := filepath.Join(dir, "audit.html")
	if err := os.WriteFile(pagePath, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	png := filepath.Join(dir, "audit.png")
	out, err := runChromium(t, browser, "--enable-logging=stderr", "--v=0", "--window-size=940,1600", "--screenshot="+png, "file://"+pagePath)
	if err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s", err, out)
	}
	if strings.Contains(out, "Uncaught") || strings.Contains(out, `CONSOLE(`) {
		t.Errorf("console output while rendering:\n%s", out)
	}
	if b, err := os.ReadFile(png); err != nil || len(b) < 10_000 || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Fatalf("screenshot: %d bytes, %v", len(b), err)
	}

	if got := checkInChromium(t, browser, html, dir, ""); got != "CHECK-DONE errors=0" {
		t.Errorf("the page in Chromium: %s", got)
	}
	// The check catches a broken page.
	if got := checkInChromium(t, browser, html, dir, "<script>notDefinedAnywhere()</script>"); !strings.HasPrefix(got, "CHECK-DONE errors=1") {
		t.Errorf("a page with a script error passed the check: %s", got)
	}
}

// fetches returns what in a page would make a browser load something:
// scripts, links, images, frames, CSS imports or urls, links off the page.
// (Partner URLs shown as text are not fetches.)
func fetches(html string) []string {
	var out []string
	for _, bad := range []string{"<script", "<link", "<img", "<iframe", "<object", "<embed", "@import", "url(", "src=", `href="http`, "href='http", `href="//`} {
		if strings.Contains(html, bad) {
			out = append(out, bad)
		}
	}
	return out
}

// TestWriteHTMLPartnersAndEventsWithoutPlays: the page shows the per-partner
// deliveries (sandbox targets marked, and the table's sandbox note), the
// valid events without plays and the possibly-twice list, like the table.
func TestWriteHTMLPartnersAndEventsWithoutPlays(t *testing.T) {
	r := &Audit{PendingThreshold: "10m0s", EventsReceived: 12, EventsWithoutPlays: 5, PlaysDerived: 3, PlaysReportable: 3,
		Delivered: 3, DeliveredToSandbox: 2, DeliveredReal: 1, PossiblyTwice: 1,
		ByPartner: []PartnerCount{
			{Partner: "http://127.0.0.1:8088", Sandbox: true, Delivered: 2, Answers: 2},
			{Partner: "https://partner.example.com", Delivered: 1, Answers: 1},
		}}
	h := &HTMLAudit{Audit: r, Bucket: time.Minute,
		Lists: []HTMLList{{Name: "possibly-twice", Label: "possibly delivered twice", N: 1, Play: true, Rows: []ListRow{{ReportID: "r-1", EventID: "e-1", Delivered: 1}}}}}
	var page, table bytes.Buffer
	if err := WriteHTML(&page, h); err != nil {
		t.Fatal(err)
	}
	if err := WriteAudit(&table, r, FormatTable); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	note := "NOTE: 2 of the 3 delivered plays were answered only by a sandbox target"
	for _, want := range []string{"valid, without plays", note, "http://127.0.0.1:8088 (sandbox)", "https://partner.example.com",
		`aria-label="deliveries"`, `<details id="list-possibly-twice" open>`, "RESULT: FAIL: 1 plays delivered once on record may have been delivered more than once"} {
		if !strings.Contains(html, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if !strings.Contains(table.String(), note) || !strings.Contains(table.String(), "valid, without plays") {
		t.Errorf("table lacks the note or the events without plays:\n%s", table.String())
	}
	if bad := fetches(html); len(bad) > 0 {
		t.Errorf("page is not self-contained: it contains %q", bad)
	}
	// A page with no sandbox deliveries has no note.
	r.DeliveredToSandbox, r.ByPartner = 0, nil
	page.Reset()
	if err := WriteHTML(&page, h); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(page.String(), "NOTE:") || !strings.Contains(page.String(), "No deliveries in the window.") {
		t.Error("a page without sandbox deliveries shows the note, or no empty partner chart")
	}
}

// escaped escapes the characters html/template escapes in text.
func escaped(s string) string {
	if strings.HasPrefix(s, "RESULT") {
		return strings.NewReplacer("'", "&#39;", `"`, "&#34;").Replace(s)
	}
	return s
}

func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("PLAYPIPE_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("no Chromium (chromium, chromium-browser, google-chrome) on PATH and PLAYPIPE_REQUIRE_CHROMIUM=1: apt-get install -y chromium")
	}
	t.Skip("no Chromium on PATH (chromium, chromium-browser, google-chrome): the HTML report is not rendered; apt-get install -y chromium (make test installs it)")
	return ""
}

func runChromium(t *testing.T, browser string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run", "--disable-extensions",
		"--user-data-dir=" + t.TempDir()}
	cmd := exec.CommandContext(ctx, browser, append(base, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// checkInChromium loads the page with a checking script in front of it
// (extra is inserted into the page too) and returns the checker's verdict:
// "CHECK-DONE errors=N …" with the script errors, console errors and charts
// without a size it saw.
func checkInChromium(t *testing.T, browser, html, dir, extra string) string {
	t.Helper()
	const checker = `<script>
window.__errs = [];
window.addEventListener('error', function (e) { __errs.push('error: ' + e.message); });
(function () { var ce = console.error; console.error = function () { __errs.push('console.error: ' + Array.prototype.join.call(arguments, ' ')); ce.apply(console, arguments); }; })();
window.addEventListener('load', function () {
  document.querySelectorAll('svg').forEach(function (s, i) { var b = s.getBoundingClientRect(); if (b.width < 50 || b.height < 20) __errs.push('svg ' + i + ' has no size'); });
  var p = document.createElement('pre'); p.id = 'check'; p.textContent = 'CHECK-DONE errors=' + __errs.length + (__errs.length ? ' ' + __errs.join(' | ') : '');
  document.body.appendChild(p);
});
</script>`
	checked := strings.Replace(html, "<head>", "<head>"+checker+extra, 1)
	path := filepath.Join(dir, fmt.Sprintf("checked-%d.html", len(extra)))
	if err := os.WriteFile(path, []byte(checked), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runChromium(t, browser, "--dump-dom", "file://"+path)
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v\n%s", err, out)
	}
	const mark = `<pre id="check">`
	i := strings.Index(out, mark)
	if i < 0 {
		return "the checker did not run: " + out
	}
	return strings.TrimSpace(strings.SplitN(out[i+len(mark):], "<", 2)[0])
}
