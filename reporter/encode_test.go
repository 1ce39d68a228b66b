package reporter

import (
	"encoding/json"
	"testing"

	"github.com/playpipe/playpipe/schemas"
)

func TestAppendDeliveryMatchesEncodingJSON(t *testing.T) {
	cases := []schemas.Delivery{
		{},
		{V: 1, ReportID: "abc", EventID: "e", Outcome: "delivered", Attempt: 1, HTTPStatus: 200, LatencyUS: 812, At: 1700000000000},
		{V: 1, ReportID: "abc", EventID: "e", Outcome: "delivered", Attempt: 1, HTTPStatus: 200, ServedBy: "live", Partner: "https://api.partner.example/v2?x=<&>", At: 1},
		{V: 1, ReportID: "abc", Outcome: "standby", Partner: "http://127.0.0.1:8088", At: 1},
		{V: 1, ReportID: "r", Outcome: "rejected", Attempt: 3, HTTPStatus: 400, Message: "include the required fields: country,os", Fields: []string{"country", "os"}, LatencyUS: 5, TraceID: "0af7651916cd43dd8448eb211c80319c", At: 1},
		{V: 1, ReportID: "r", Outcome: "standby", ServedBy: "standby", Replay: true, Reason: "http_503", Message: "quote \" back\\slash <html> & \u00e9 \n\t\x01 \u2028", Fields: []string{}, At: -1, LatencyUS: -3},
		{V: 1, ReportID: "r", Outcome: "delivered", HTTPStatus: 200, InDoubt: true, ReplayID: "rp-20261123T2130Z-1a2b", ReplayReason: "partner lost 14:02–14:40 \"standby\" <x>", At: 1},
		{V: 1, ReportID: "r", Outcome: "rejected", HTTPStatus: 400, ReplayID: "x", At: 1},
		{V: 1, EventID: "\xff invalid utf-8", Message: "partnerapi: POST /partners/royalty-tracking: transient: dial tcp: connection refused"},
	}
	for i, d := range cases {
		want, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendDelivery(nil, &d); string(got) != string(want) {
			t.Errorf("case %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

func FuzzAppendDelivery(f *testing.F) {
	f.Add("id", "event", "message", "field", "http://127.0.0.1:8088", 200, int64(5), true, "rp-1", "reason")
	f.Fuzz(func(t *testing.T, id, ev, msg, field, partner string, status int, lat int64, replay bool, replayID, replayReason string) {
		d := schemas.Delivery{V: 1, ReportID: id, EventID: ev, Outcome: "retry", Attempt: 2, HTTPStatus: status, Partner: partner, Message: msg, Fields: []string{field}, LatencyUS: lat, Replay: replay,
			ReplayID: replayID, ReplayReason: replayReason, At: lat}
		want, _ := json.Marshal(d)
		if got := appendDelivery(nil, &d); string(got) != string(want) {
			t.Fatalf("got %s\nwant %s", got, want)
		}
	})
}

func BenchmarkDeliveryEncoding(b *testing.B) {
	d := schemas.Delivery{V: 1, ReportID: "0af7651916cd43dd8448eb211c80319c", EventID: "ev-123456", Outcome: "delivered", Attempt: 1, HTTPStatus: 200, LatencyUS: 812, TraceID: "0af7651916cd43dd8448eb211c80319c", At: 1700000000000}
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			_, _ = json.Marshal(d)
		}
	})
	b.Run("appendDelivery", func(b *testing.B) {
		buf := make([]byte, 0, 512)
		for b.Loop() {
			buf = appendDelivery(buf[:0], &d)
		}
	})
}
