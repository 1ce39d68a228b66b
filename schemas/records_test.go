package schemas

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestRejectionBounded checks that a rejection record stays within its bound
// whatever the event (escaping included), keeps a prefix of the event on a
// character boundary, and describes the whole event by length and hash.
func TestRejectionBounded(t *testing.T) {
	src := Source{Topic: "plays.events", Partition: 1, Offset: 2}
	vs := []Violation{{Field: "mix_id", Reason: ReasonTooLarge, Detail: "event is 200000 bytes"}}
	cases := map[string][]byte{
		"small":            []byte(`{"event_id":"e"}`),
		"200k <":           []byte(`{"event_id":"p","mix_id":999999,"pad":"` + strings.Repeat("<", 200_000) + `"}`),
		"5 MiB plain":      bytes.Repeat([]byte("a"), 5<<20),
		"control bytes":    bytes.Repeat([]byte{0x01}, 100_000),
		"multibyte":        []byte(strings.Repeat("é🎧\u2028", 30_000)),
		"invalid utf8":     bytes.Repeat([]byte{0xff, 'a'}, 100_000),
		"exactly at bound": bytes.Repeat([]byte("b"), MaxRejectionRaw-2),
		"one over bound":   bytes.Repeat([]byte("b"), MaxRejectionRaw-1),
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			r := NewRejection(raw, "e", vs, src, 1)
			enc, err := json.Marshal(r.Raw)
			if err != nil {
				t.Fatal(err)
			}
			if len(enc) > MaxRejectionRaw {
				t.Fatalf("encoded raw is %d bytes, bound %d", len(enc), MaxRejectionRaw)
			}
			rec, _ := json.Marshal(r)
			if len(rec) > MaxRejectionRaw+1024 {
				t.Errorf("record is %d bytes", len(rec))
			}
			sum := sha256.Sum256(raw)
			if r.RawLen != len(raw) || r.RawSHA256 != hex.EncodeToString(sum[:]) {
				t.Errorf("raw_len %d raw_sha256 %s, want %d %x", r.RawLen, r.RawSHA256, len(raw), sum)
			}
			kept := []byte(r.Raw)
			if r.RawBase64 {
				if kept, err = base64.StdEncoding.DecodeString(r.Raw); err != nil {
					t.Fatal(err)
				}
			} else if !utf8.ValidString(r.Raw) {
				t.Error("raw cut inside a character")
			}
			if !bytes.HasPrefix(raw, kept) {
				t.Error("raw is not a prefix of the event")
			}
			if r.RawTruncated != (len(kept) < len(raw)) {
				t.Errorf("raw_truncated %v with %d of %d bytes kept", r.RawTruncated, len(kept), len(raw))
			}
			// Not cut shorter than needed: one more character would not fit.
			if r.RawTruncated && !r.RawBase64 {
				_, n := utf8.DecodeRune(raw[len(kept):])
				more, _ := json.Marshal(string(raw[:len(kept)+n]))
				if len(more) <= MaxRejectionRaw {
					t.Errorf("cut at %d bytes, but %d would still fit (%d encoded)", len(kept), len(kept)+n, len(more))
				}
			}
		})
	}
	if r := NewRejection(cases["exactly at bound"], "", vs, src, 1); r.RawTruncated {
		t.Error("an event whose encoding is exactly the bound was truncated")
	}
	if r := NewRejectionBounded(cases["small"], "", vs, src, 1, 0); r.Raw != "" || !r.RawTruncated || r.RawLen != len(cases["small"]) {
		t.Errorf("bound 0: %+v", r)
	}
}
