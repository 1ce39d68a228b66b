package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/producertest"
	"github.com/playpipe/playpipe/testkit/testenv"
)

const (
	acmeKey  = "acme-secret-key-1"
	otherKey = "other-fleet-key-2"
)

type gatewayEnv struct {
	k   *testenv.Kafka
	srv *httptest.Server
	gw  *Gateway
	log *bytes.Buffer
}

func startGateway(t *testing.T, cfg Config, pcfg producer.Config) *gatewayEnv {
	t.Helper()
	k := testenv.StartKafka(t, 3)
	p := producertest.NewPublisher(t, k, pcfg)
	var logBuf bytes.Buffer
	cfg.Publisher = p
	if cfg.Now == nil {
		cfg.Now = producertest.Now
	}
	cfg.MeterProvider, cfg.TracerProvider = producertest.MeterProvider, producertest.TracerProvider
	// slog's handler serialises its writes (one Write per record).
	cfg.Logger = slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	for _, spec := range []string{"acme:" + HashKey(acmeKey), "other:" + HashKey(otherKey)} {
		fk, err := ParseFleetKey(spec)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Keys = append(cfg.Keys, fk)
	}
	gw, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return &gatewayEnv{k: k, srv: srv, gw: gw, log: &logBuf}
}

func (e *gatewayEnv) post(t *testing.T, contentType string, body []byte, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/events", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

var bearer = []string{"Authorization", "Bearer " + acmeKey}

func TestGatewayAuth(t *testing.T) {
	e := startGateway(t, Config{}, producer.Config{})
	body := []byte("[" + string(producertest.ValidEvent("a1")) + "]")
	for name, hdr := range map[string][]string{
		"no key":          nil,
		"wrong key":       {"Authorization", "Bearer nope"},
		"hash as key":     {"X-API-Key", HashKey(acmeKey)},
		"basic scheme":    {"Authorization", "Basic " + acmeKey},
		"empty bearer":    {"Authorization", "Bearer "},
		"key with suffix": {"X-API-Key", acmeKey + "x"},
	} {
		resp, b := e.post(t, "application/json", body, hdr...)
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" || !strings.Contains(string(b), `"unauthorized"`) {
			t.Errorf("%s: %d %s", name, resp.StatusCode, b)
		}
	}
	if n := len(producertest.ReadTopic(t, e.k, e.k.Config.Topics().Events, 0)); n != 0 {
		t.Fatalf("unauthorized requests put %d events on the topic", n)
	}
	for name, hdr := range map[string][]string{
		"bearer":    bearer,
		"x-api-key": {"X-API-Key", otherKey},
	} {
		resp, b := e.post(t, "application/json", []byte("["+string(producertest.ValidEvent("ok-"+name))+"]"), hdr...)
		if resp.StatusCode != http.StatusAccepted {
			t.Errorf("%s: %d %s", name, resp.StatusCode, b)
		}
	}
	recs := producertest.ReadTopic(t, e.k, e.k.Config.Topics().Events, 2)
	fleets := map[string]string{}
	for _, r := range recs {
		fleets[string(r.Key)] = producertest.HeaderValue(r, "fleet")
	}
	if len(recs) != 2 || fleets["ok-bearer"] != "acme" || fleets["ok-x-api-key"] != "other" {
		t.Errorf("events on topic: %v", fleets)
	}
	for _, secret := range []string{acmeKey, otherKey, "nope"} {
		if strings.Contains(e.log.String(), secret) {
			t.Errorf("the log holds an API key: %s", e.log.String())
		}
	}
}

func TestGatewayRateLimit(t *testing.T) {
	e := startGateway(t, Config{MaxEvents: 4, RatePerKey: 0.5, Burst: 4}, producer.Config{})
	batch := func(prefix string, n int) []byte {
		var b bytes.Buffer
		for i := 0; i < n; i++ {
			b.Write(producertest.ValidEvent(fmt.Sprintf("%s-%d", prefix, i)))
			b.WriteByte('\n')
		}
		return b.Bytes()
	}
	if resp, b := e.post(t, "application/x-ndjson", batch("a", 3), bearer...); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("first batch: %d %s", resp.StatusCode, b)
	}
	// One token left: a batch of 2 must wait about 2 s at 0.5 events/s.
	resp, b := e.post(t, "application/x-ndjson", batch("b", 2), bearer...)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second batch: %d %s, want 429", resp.StatusCode, b)
	}
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 3 {
		t.Errorf("Retry-After %q, want 1–3 s", resp.Header.Get("Retry-After"))
	}
	// Another key has its own budget.
	if resp, b := e.post(t, "application/x-ndjson", batch("c", 4), "X-API-Key", otherKey); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("other key: %d %s", resp.StatusCode, b)
	}
	// The refused batch did not consume tokens: one event still fits.
	if resp, b := e.post(t, "application/x-ndjson", batch("d", 1), bearer...); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("single event after 429: %d %s", resp.StatusCode, b)
	}
	if resp, _ := e.post(t, "application/x-ndjson", batch("e", 1), bearer...); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("empty bucket: %d", resp.StatusCode)
	}
	keys := map[string]bool{}
	for _, r := range producertest.ReadTopic(t, e.k, e.k.Config.Topics().Events, 8) {
		keys[string(r.Key)] = true
	}
	if len(keys) != 8 || keys["b-0"] || keys["e-0"] {
		t.Errorf("events on topic: %v (want a-0..2, c-0..3, d-0)", keys)
	}
}

func TestGatewayRefusesWholeRequests(t *testing.T) {
	e := startGateway(t, Config{MaxBodyBytes: 2048, MaxEvents: 3}, producer.Config{})
	big := bytes.Repeat([]byte(" "), 3000)
	tests := []struct {
		name        string
		contentType string
		body        []byte
		hdr         []string
		status      int
		code        string
	}{
		{"oversized body", "application/json", append([]byte("["), big...), nil, 413, "body_too_large"},
		{"oversized chunked body", "application/json", nil, []string{"X-Chunked", "1"}, 413, "body_too_large"},
		{"too many events (array)", "application/json", []byte("[{},{},{},{}]"), nil, 413, "too_many_events"},
		{"too many events (ndjson)", "application/x-ndjson", []byte("{}\n{}\n\n{}\n{}\n"), nil, 413, "too_many_events"},
		{"malformed array", "application/json", []byte(`[{"a":1},`), nil, 400, "malformed_batch"},
		{"data after the array", "application/json", []byte(`[{"a":1}] x`), nil, 400, "malformed_batch"},
		{"empty body", "application/json", nil, nil, 400, "empty_batch"},
		{"empty array", "application/json", []byte(" [ ] "), nil, 400, "empty_batch"},
		{"blank lines", "application/x-ndjson", []byte("\n \n"), nil, 400, "empty_batch"},
		{"xml", "application/xml", []byte("<e/>"), nil, 415, "unsupported_media_type"},
		{"form type is sniffed (curl -d)", "application/x-www-form-urlencoded", []byte("[]"), nil, 400, "empty_batch"},
		{"gzip", "application/json", []byte("[]"), []string{"Content-Encoding", "gzip"}, 415, "unsupported_encoding"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var resp *http.Response
			var b []byte
			if tt.name == "oversized chunked body" { // no Content-Length: the limit applies while reading
				req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/events", io.MultiReader(bytes.NewReader([]byte("[")), bytes.NewReader(big)))
				req.Header.Set("Authorization", bearer[1])
				req.Header.Set("Content-Type", tt.contentType)
				r, err := e.srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ = io.ReadAll(r.Body)
				r.Body.Close()
				resp = r
			} else {
				resp, b = e.post(t, tt.contentType, tt.body, append(append([]string{}, bearer...), tt.hdr...)...)
			}
			var er ErrorResponse
			if resp.StatusCode != tt.status || json.Unmarshal(b, &er) != nil || er.Code != tt.code || er.Error == "" {
				t.Errorf("%d %s, want %d %s", resp.StatusCode, b, tt.status, tt.code)
			}
		})
	}
	if resp, _ := e.post(t, "", nil, bearer...); resp.StatusCode != 400 {
		t.Errorf("GET-less empty POST: %d", resp.StatusCode)
	}
	resp, err := e.srv.Client().Get(e.srv.URL + "/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/events: %d, want 405", resp.StatusCode)
	}
}

// TestGatewayMixedBatch sends valid and invalid events in both formats and
// checks the exact per-event answer, that exactly the accepted events are on
// the events topic and exactly the refused ones on the rejected topic.
func TestGatewayMixedBatch(t *testing.T) {
	e := startGateway(t, Config{}, producer.Config{})
	topics := e.k.Config.Topics()
	badCountry := `{"event_id":"bad-country","mix_id":42,"started_at":1700000000000,"offset_ms":0,"duration_ms":1000,"user_id":"u","country":"Germany","os":"o","device":"d","vendor":1}`
	noUser := `{"event_id":"no-user","mix_id":42,"started_at":1700000000000,"offset_ms":0,"duration_ms":1000,"country":"DE","os":"o","device":"d","vendor":1}`
	arrayBody := "[" + string(producertest.ValidEvent("arr-0")) + "," + badCountry + ",\n  42, " + string(producertest.ValidEvent("arr-3")) + "]"
	ndjsonBody := string(producertest.ValidEvent("nd-0")) + "\r\n\n" + `{"event_id":"broken",` + "\n" + noUser + "\n" + string(producertest.ValidEvent("nd-3"))

	type want struct {
		status  producer.Status
		id      string
		reasons []string
	}
	cases := []struct {
		name, contentType, body string
		want                    []want
	}{
		{"array", "application/json", arrayBody, []want{
			{producer.StatusAccepted, "arr-0", nil}, {producer.StatusRefused, "bad-country", []string{"bad_country"}},
			{producer.StatusRefused, "", []string{"malformed_json"}}, {producer.StatusAccepted, "arr-3", nil}}},
		{"ndjson sniffed", "", ndjsonBody, []want{
			{producer.StatusAccepted, "nd-0", nil}, {producer.StatusRefused, "", []string{"malformed_json"}},
			{producer.StatusRefused, "no-user", []string{"missing_user_id"}}, {producer.StatusAccepted, "nd-3", nil}}},
	}
	var acceptedIDs, refusedRaw []string
	for _, c := range cases {
		resp, b := e.post(t, c.contentType, []byte(c.body), bearer...)
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("%s: %d %s", c.name, resp.StatusCode, b)
		}
		var ir IngestResponse
		if err := json.Unmarshal(b, &ir); err != nil {
			t.Fatal(err)
		}
		if ir.Accepted != 2 || ir.Refused != 2 || ir.Failed != 0 || len(ir.Events) != len(c.want) {
			t.Fatalf("%s: %s", c.name, b)
		}
		for i, w := range c.want {
			a := ir.Events[i]
			var reasons []string
			for _, v := range a.Reasons {
				reasons = append(reasons, v.Reason)
			}
			if a.Index != i || a.Status != w.status || a.EventID != w.id || fmt.Sprint(reasons) != fmt.Sprint(w.reasons) {
				t.Errorf("%s event %d: %+v, want %+v", c.name, i, a, w)
			}
			if w.status == producer.StatusAccepted {
				if a.Partition == nil || a.Offset == nil {
					t.Errorf("%s event %d: accepted without partition/offset", c.name, i)
				}
				acceptedIDs = append(acceptedIDs, w.id)
			}
		}
	}
	refusedRaw = []string{badCountry, "42", `{"event_id":"broken",`, noUser}

	var onTopic []string
	for _, r := range producertest.ReadTopic(t, e.k, topics.Events, len(acceptedIDs)) {
		var ev schemas.PlayerEvent
		if err := json.Unmarshal(r.Value, &ev); err != nil || ev.EventID != string(r.Key) {
			t.Errorf("record %s: %v", r.Value, err)
		}
		onTopic = append(onTopic, string(r.Key))
	}
	sort.Strings(onTopic)
	sort.Strings(acceptedIDs)
	if fmt.Sprint(onTopic) != fmt.Sprint(acceptedIDs) {
		t.Errorf("events topic holds %v, want exactly %v", onTopic, acceptedIDs)
	}
	var rejected []string
	for _, r := range producertest.ReadTopic(t, e.k, topics.Rejected, len(refusedRaw)) {
		var rej schemas.Rejection
		if err := json.Unmarshal(r.Value, &rej); err != nil {
			t.Fatal(err)
		}
		if rej.Source.Topic != IngestSource || rej.Source.Partition != -1 || rej.Source.Offset != -1 || rej.Reason == "" || len(rej.Violations) == 0 {
			t.Errorf("rejection %+v", rej)
		}
		rejected = append(rejected, rej.Raw)
	}
	sort.Strings(rejected)
	sort.Strings(refusedRaw)
	if fmt.Sprint(rejected) != fmt.Sprint(refusedRaw) {
		t.Errorf("rejected topic holds %q, want exactly %q", rejected, refusedRaw)
	}
}

// TestGatewayProduceFailure: when Kafka refuses the produce requests, the
// gateway must not answer 202, must report the valid events as failed, and
// nothing may be on the events topic.
func TestGatewayProduceFailure(t *testing.T) {
	e := startGateway(t, Config{}, producer.Config{DeliveryTimeout: 2 * time.Second})
	producertest.FailProduce(t, e.k, e.k.Config.Topics().Events)
	body := "[" + string(producertest.ValidEvent("f-0")) + `,{"event_id":"f-1"},` + string(producertest.ValidEvent("f-2")) + "]"
	resp, b := e.post(t, "application/json", []byte(body), bearer...)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d %s, want 503 with Retry-After", resp.StatusCode, b)
	}
	var ir IngestResponse
	if err := json.Unmarshal(b, &ir); err != nil {
		t.Fatal(err)
	}
	if ir.Accepted != 0 || ir.Failed != 2 || ir.Refused != 1 || ir.Events[0].Status != producer.StatusFailed || ir.Events[2].Status != producer.StatusFailed ||
		ir.Events[1].Status != producer.StatusRefused || ir.Error == "" {
		t.Fatalf("answer %s", b)
	}
	if n := len(producertest.ReadTopic(t, e.k, e.k.Config.Topics().Events, 0)); n != 0 {
		t.Fatalf("%d events on the topic after a failed produce", n)
	}
}

// TestGatewayBrokerDown stops the broker: the answer must be 503 and
// /readyz must say not ready.
func TestGatewayBrokerDown(t *testing.T) {
	e := startGateway(t, Config{}, producer.Config{DeliveryTimeout: time.Second})
	get := func(path string) int {
		resp, err := e.srv.Client().Get(e.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := get("/readyz"); s != 200 {
		t.Fatalf("readyz with a broker: %d", s)
	}
	e.k.Close()
	resp, b := e.post(t, "application/json", []byte("["+string(producertest.ValidEvent("down"))+"]"), bearer...)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), `"failed":1`) {
		t.Fatalf("broker down: %d %s", resp.StatusCode, b)
	}
	if s := get("/readyz"); s != 503 {
		t.Errorf("readyz without a broker: %d", s)
	}
	if s := get("/healthz"); s != 200 {
		t.Errorf("healthz: %d", s)
	}
	e.gw.SetDraining()
	if s := get("/readyz"); s != 503 {
		t.Errorf("readyz while draining: %d", s)
	}
}

func TestConfigValidation(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	p := producertest.NewPublisher(t, k, producer.Config{})
	key, _ := ParseFleetKey("a:" + HashKey("x"))
	for name, cfg := range map[string]Config{
		"Publisher":                {Keys: []FleetKey{key}},
		"Keys":                     {Publisher: p},
		"--burst":                  {Publisher: p, Keys: []FleetKey{key}, MaxEvents: 100, Burst: 10},
		"--rate":                   {Publisher: p, Keys: []FleetKey{key}, RatePerKey: -1},
		"share":                    {Publisher: p, Keys: []FleetKey{key, {Fleet: "b", Hash: key.Hash}}},
		"--max-body":               {Publisher: p, Keys: []FleetKey{key}, MaxBodyBytes: -5},
		"--max-event-bytes":        {Publisher: p, Keys: []FleetKey{key}, MaxEventBytes: MaxEventBytesCeiling + 1},
		"--max-concurrent-per-key": {Publisher: p, Keys: []FleetKey{key}, MaxConcurrent: 4, MaxConcurrentPerKey: 5},
		"--min-body-rate":          {Publisher: p, Keys: []FleetKey{key}, MinBodyRate: -1},
		"--body-grace":             {Publisher: p, Keys: []FleetKey{key}, BodyGrace: -time.Second},
		"--read-timeout":           {Publisher: p, Keys: []FleetKey{key}, ReadTimeout: -time.Second},
	} {
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func TestParseFleetKeys(t *testing.T) {
	ks, err := ParseFleetKeys(strings.NewReader("# fleets\n\nacme:" + HashKey("k1") + "\n  beta : " + strings.ToUpper(HashKey("k2")) + "  \n"))
	if err != nil || len(ks) != 2 || ks[0].Fleet != "acme" || ks[1].Fleet != "beta" {
		t.Fatalf("%v %+v", err, ks)
	}
	kr, err := newKeyring(ks)
	if err != nil {
		t.Fatal(err)
	}
	if kr.match("k1") != 0 || kr.match("k2") != 1 || kr.match("k3") != -1 || kr.match("") != -1 {
		t.Error("match")
	}
	for _, bad := range []string{"acme", ":" + HashKey("k"), "acme:abc", "acme:" + HashKey("k") + "00", "a b:" + HashKey("k"), "raw-secret-key"} {
		_, err := ParseFleetKey(bad)
		if err == nil || (bad == "raw-secret-key" && strings.Contains(err.Error(), bad)) {
			t.Errorf("%q: err = %v", bad, err)
		}
	}
	if _, err := ParseFleetKeys(strings.NewReader("ok:" + HashKey("a") + "\nbroken\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("err = %v, want one naming line 2", err)
	}
	if _, err := ParseFleetKeys(strings.NewReader("")); err != nil {
		t.Error(err)
	}
}

// TestGatewayOverloaded fills the request slots with requests stuck in
// Kafka (produce requests are held by the broker) and checks that the next
// request is answered 503 "overloaded" at once, and that the slot is
// released afterwards.
func TestGatewayOverloaded(t *testing.T) {
	e := startGateway(t, Config{MaxConcurrent: 1}, producer.Config{DeliveryTimeout: 3 * time.Second})
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	c := e.k.Cluster()
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.DropControl() // hold the first produce request only
		held <- struct{}{}
		select {
		case <-hold:
		case <-time.After(5 * time.Second):
		}
		return nil, nil, false // then handle it normally
	})
	first := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/events", bytes.NewReader(producertest.ValidEvent("slow")))
		req.Header.Set("X-API-Key", acmeKey)
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	select { // the first request is now waiting for Kafka, holding the only slot
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the first request never reached Kafka")
	}
	resp, b := e.post(t, "", producertest.ValidEvent("second"), "X-API-Key", otherKey) // another key: acme's own limit would answer first
	close(hold)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), `"overloaded"`) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("while the slot is taken: %d %s", resp.StatusCode, b)
	}
	if s := <-first; s != http.StatusAccepted {
		t.Fatalf("the slow request: %d", s)
	}
	if resp, b := e.post(t, "", producertest.ValidEvent("third"), bearer...); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("after the slot was released: %d %s", resp.StatusCode, b)
	}
}
