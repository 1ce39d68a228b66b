package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/producertest"
)

// poisonEvent is valid JSON with an unknown mix and a pad field of n '<'
// characters: an event whose escaped rejection record can exceed 1 MiB.
func poisonEvent(id string, n int) []byte {
	return []byte(fmt.Sprintf(`{"event_id":%q,"mix_id":999999,"started_at":1700000000000,"offset_ms":0,"duration_ms":1000,"user_id":"u","country":"DE","os":"o","device":"d","vendor":1,"pad":"%s"}`,
		id, strings.Repeat("<", n)))
}

// storedRejection is a rejection record as the gateway writes it.
type storedRejection struct {
	schemas.Rejection
	RawLen       int    `json:"raw_len"`
	RawSHA256    string `json:"raw_sha256"`
	RawTruncated bool   `json:"raw_truncated"`
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestGatewayEventSizeLimit: events over MaxEventBytes are refused with
// reason too_large (413 when the request holds nothing else, one refused
// answer of a 202 otherwise), never 503, and each refused event has a
// rejection record that fits Kafka: a bounded prefix, its length and SHA-256.
func TestGatewayEventSizeLimit(t *testing.T) {
	e := startGateway(t, Config{}, producer.Config{}) // defaults: 64 KiB per event, 4 MiB per body
	topics := e.k.Config.Topics()
	poison := poisonEvent("poison-200k", 200_000)
	huge := poisonEvent("huge-2m", 2<<20)
	var ir IngestResponse

	for name, ev := range map[string][]byte{"200 KB": poison, "2 MiB": huge} {
		resp, b := e.post(t, "application/x-ndjson", ev, bearer...)
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("%s event: %d %.300s, want 413", name, resp.StatusCode, b)
		}
		ir = IngestResponse{}
		if err := json.Unmarshal(b, &ir); err != nil {
			t.Fatal(err)
		}
		if ir.Refused != 1 || ir.Accepted != 0 || ir.Failed != 0 || len(ir.Events) != 1 || ir.Error == "" {
			t.Fatalf("%s event: answer %s", name, b)
		}
		a := ir.Events[0]
		if a.Status != producer.StatusRefused || len(a.Reasons) != 1 || a.Reasons[0].Reason != ReasonTooLarge ||
			!strings.Contains(a.Reasons[0].Detail, fmt.Sprint(len(ev))) || a.Error != "" {
			t.Errorf("%s event: per-event answer %+v", name, a)
		}
		if a.EventID != map[string]string{"200 KB": "poison-200k", "2 MiB": "huge-2m"}[name] {
			t.Errorf("%s event: event_id %q", name, a.EventID)
		}
	}

	// A batch: the oversized event is one refused answer; the others pass.
	batch := bytes.Join([][]byte{producertest.ValidEvent("size-0"), poison, producertest.ValidEvent("size-2")}, []byte("\n"))
	resp, b := e.post(t, "application/x-ndjson", batch, bearer...)
	ir = IngestResponse{}
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal(b, &ir) != nil {
		t.Fatalf("mixed batch: %d %.300s", resp.StatusCode, b)
	}
	if ir.Accepted != 2 || ir.Refused != 1 || ir.Events[1].Status != producer.StatusRefused || ir.Events[1].Reasons[0].Reason != ReasonTooLarge ||
		ir.Events[0].Status != producer.StatusAccepted || ir.Events[2].Status != producer.StatusAccepted || ir.Events[1].Index != 1 {
		t.Errorf("mixed batch: %.500s", b)
	}

	// A body over MaxBodyBytes is refused as a whole, before it is read.
	resp, b = e.post(t, "application/x-ndjson", poisonEvent("five-mib", 5<<20), bearer...)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), `"body_too_large"`) {
		t.Errorf("5 MiB body: %d %.300s", resp.StatusCode, b)
	}

	// An event just under the limit is not refused for its size.
	atLimit := poisonEvent("at-limit", 0)
	atLimit = poisonEvent("at-limit", DefaultMaxEventBytes-len(atLimit))
	if len(atLimit) != DefaultMaxEventBytes {
		t.Fatalf("test event is %d bytes", len(atLimit))
	}
	resp, b = e.post(t, "application/json", append(append([]byte("["), atLimit...), ']'), bearer...)
	if resp.StatusCode != http.StatusAccepted || !strings.Contains(string(b), `"accepted":1`) {
		t.Errorf("event of exactly %d bytes: %d %.300s", len(atLimit), resp.StatusCode, b)
	}

	want := map[string][]byte{"poison-200k": poison, "huge-2m": huge}
	got := map[string]int{}
	for _, r := range producertest.ReadTopic(t, e.k, topics.Rejected, 3) {
		if len(r.Value) > MaxRejectionRecordBytes {
			t.Errorf("rejection record of %d bytes", len(r.Value))
		}
		var rej storedRejection
		if err := json.Unmarshal(r.Value, &rej); err != nil {
			t.Fatal(err)
		}
		raw, ok := want[rej.EventID]
		if !ok || string(r.Key) != rej.EventID {
			t.Errorf("unexpected rejection %q (key %q)", rej.EventID, r.Key)
			continue
		}
		got[rej.EventID]++
		if rej.Reason != ReasonTooLarge || rej.Source.Topic != IngestSource || rej.Source.Offset != -1 || rej.RawBase64 ||
			rej.RawLen != len(raw) || rej.RawSHA256 != sha(raw) || !rej.RawTruncated ||
			len(rej.Raw) == 0 || len(rej.Raw) > RejectionRawBound || !bytes.HasPrefix(raw, []byte(rej.Raw)) {
			t.Errorf("rejection of %s: reason %s, raw %d bytes, raw_len %d, truncated %v, sha ok %v",
				rej.EventID, rej.Reason, len(rej.Raw), rej.RawLen, rej.RawTruncated, rej.RawSHA256 == sha(raw))
		}
		if producertest.HeaderValue(r, "fleet") != "acme" {
			t.Errorf("rejection of %s: fleet header %q", rej.EventID, producertest.HeaderValue(r, "fleet"))
		}
	}
	if got["poison-200k"] != 2 || got["huge-2m"] != 1 {
		t.Errorf("rejections on the topic: %v, want poison-200k twice and huge-2m once", got)
	}
	keys := map[string]bool{}
	for _, r := range producertest.ReadTopic(t, e.k, topics.Events, 3) {
		keys[string(r.Key)] = true
	}
	if len(keys) != 3 || !keys["size-0"] || !keys["size-2"] || !keys["at-limit"] {
		t.Errorf("events topic holds %v", keys)
	}
}

// TestGatewayRejectionOfEscapedEvent: an event under the size limit whose
// JSON escaping grows six-fold (control bytes) is still recorded in a record
// under the bound, with its raw bytes cut.
func TestGatewayRejectionOfEscapedEvent(t *testing.T) {
	e := startGateway(t, Config{MaxEventBytes: 900 << 10}, producer.Config{})
	ev := bytes.Repeat([]byte{0x01}, 900<<10) // not JSON: refused malformed_json; escapes to 5.4 MB
	resp, b := e.post(t, "application/x-ndjson", ev, bearer...)
	if resp.StatusCode != http.StatusAccepted || !strings.Contains(string(b), `"malformed_json"`) || !strings.Contains(string(b), `"refused":1`) {
		t.Fatalf("%d %.300s", resp.StatusCode, b)
	}
	recs := producertest.ReadTopic(t, e.k, e.k.Config.Topics().Rejected, 1)
	if len(recs) != 1 {
		t.Fatalf("%d rejection records", len(recs))
	}
	var rej storedRejection
	if err := json.Unmarshal(recs[0].Value, &rej); err != nil {
		t.Fatal(err)
	}
	if len(recs[0].Value) > MaxRejectionRecordBytes || !rej.RawTruncated || rej.RawLen != len(ev) || rej.RawSHA256 != sha(ev) ||
		!bytes.HasPrefix(ev, []byte(rej.Raw)) || len(rej.Raw) == 0 || rej.Reason != schemas.ReasonMalformedJSON {
		t.Errorf("record of %d bytes: raw %d bytes, raw_len %d, truncated %v, reason %s", len(recs[0].Value), len(rej.Raw), rej.RawLen, rej.RawTruncated, rej.Reason)
	}
}

func TestEncodeRejectionBounds(t *testing.T) {
	src := schemas.Source{Topic: IngestSource, Partition: -1, Offset: -1}
	vs := []schemas.Violation{{Reason: schemas.ReasonMalformedJSON, Detail: "x"}}
	cases := map[string][]byte{
		"small":            []byte(`{"a":1}`),
		"multi-byte runes": bytes.Repeat([]byte("é<"), 100_000),
		"invalid utf-8":    bytes.Repeat([]byte{0xff, 0x01}, 300_000),
		"quotes":           bytes.Repeat([]byte(`"\`), 400_000),
	}
	for name, raw := range cases {
		val, err := encodeRejection(raw, "id", vs, src, 1)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var rej storedRejection
		if err := json.Unmarshal(val, &rej); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(val) > MaxRejectionRecordBytes || rej.RawLen != len(raw) || rej.RawSHA256 != sha(raw) {
			t.Errorf("%s: %d bytes, raw_len %d", name, len(val), rej.RawLen)
		}
		stored := []byte(rej.Raw)
		if rej.RawBase64 {
			if utf8.Valid(raw) {
				t.Errorf("%s: valid UTF-8 stored as base64", name)
			}
			continue
		}
		if !utf8.Valid(stored) || !bytes.HasPrefix(raw, stored) || rej.RawTruncated != (len(stored) < len(raw)) {
			t.Errorf("%s: stored %d of %d bytes, truncated %v", name, len(stored), len(raw), rej.RawTruncated)
		}
		if name == "small" && (rej.RawTruncated || rej.Raw != string(raw)) {
			t.Errorf("small event changed: %+v", rej)
		}
	}
	// Violations alone over the bound: their details are cut.
	long := []schemas.Violation{{Reason: "r", Detail: strings.Repeat("\x02", 200_000)}}
	val, err := encodeRejection([]byte("x"), "", long, src, 1)
	if err != nil || len(val) > MaxRejectionRecordBytes {
		t.Fatalf("long details: %d bytes, %v", len(val), err)
	}
}
