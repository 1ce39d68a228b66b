package schemas

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"unicode/utf8"
)

func ptrTo[T any](v T) *T { return &v }

func TestAppendTrackPlayMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() string { return trickyJSONStrings[rng.IntN(len(trickyJSONStrings))] }
	for i := 0; i < 2000; i++ {
		p := TrackPlay{
			V: 1, ReportID: ReportID(pick(), i), EventID: pick(), MixID: rng.Int64() - rng.Int64(),
			Position: rng.IntN(100), OverlapMS: rng.Int64N(1 << 40), BelowMinimum: rng.IntN(2) == 0,
			NoUserID: rng.IntN(2) == 0, StandbyListing: rng.IntN(2) == 0, DerivedAt: rng.Int64(),
			Report: PlayReport{
				TrackID: rng.Int64() - rng.Int64(), PlayedAt: 1_700_000_000_000 + rng.Int64N(1e9), PlayLength: rng.Int64N(10000),
				SourceStream: pick(), SourceDetail: pick(), OS: pick(), Device: pick(), Country: pick(),
				Vendor: rng.Int64N(1000) - 10, UserID: pick(), ISRC: pick(),
			},
		}
		if rng.IntN(2) == 0 {
			p.EventAt = 1_700_000_000_000 + rng.Int64N(1e9)
		}
		if rng.IntN(2) == 0 {
			p.Report.EndReason = ptrTo(rng.Int64N(3) - 1)
		}
		if rng.IntN(2) == 0 {
			p.Report.CachedPlay = ptrTo(rng.IntN(2) == 0)
		}
		if rng.IntN(2) == 0 {
			p.Report.JumpForward = ptrTo(rng.IntN(2) == 0)
		}
		want, err := json.Marshal(&p)
		if err != nil {
			t.Fatal(err)
		}
		got := AppendTrackPlay(nil, &p)
		if !bytes.Equal(got, want) {
			t.Fatalf("mismatch for %+v\n got: %s\nwant: %s", p, got, want)
		}
		wantR, _ := json.Marshal(&p.Report)
		if gotR := AppendReportJSON(nil, &p.Report); !bytes.Equal(gotR, wantR) {
			t.Fatalf("report mismatch\n got: %s\nwant: %s", gotR, wantR)
		}
	}
}

func TestISRCRoundTripsByteForByte(t *testing.T) {
	// Whatever a listing served (it was JSON, so valid UTF-8), decoding our
	// encoding gives the same bytes back.
	for _, s := range trickyJSONStrings {
		if !utf8.ValidString(s) {
			continue
		}
		p := TrackPlay{Report: PlayReport{ISRC: s}}
		var back TrackPlay
		if err := json.Unmarshal(AppendTrackPlay(nil, &p), &back); err != nil {
			t.Fatal(err)
		}
		if back.Report.ISRC != s {
			t.Fatalf("isrc %q came back as %q", s, back.Report.ISRC)
		}
	}
}

func TestAppendTrackPlayNoAllocs(t *testing.T) {
	p := TrackPlay{V: 1, ReportID: ReportID("e", 1), EventID: "e", Report: PlayReport{ISRC: "X", EndReason: ptrTo(int64(1))}}
	buf := make([]byte, 0, 4096)
	if n := testing.AllocsPerRun(100, func() { buf = AppendTrackPlay(buf[:0], &p) }); n != 0 {
		t.Fatalf("AppendTrackPlay allocates %v times per call", n)
	}
}

func TestAppendTrackPlayWithByteID(t *testing.T) {
	p := TrackPlay{V: 1, ReportID: ReportID("e", 2), EventID: "e", Report: PlayReport{ISRC: "X"}}
	want := AppendTrackPlay(nil, &p)
	id := []byte(p.ReportID)
	p.ReportID = ""
	if got := AppendTrackPlayWithID(nil, &p, id); !bytes.Equal(got, want) {
		t.Fatalf("got %s want %s", got, want)
	}
}

func TestAppendDeliveryMatchesEncodingJSON(t *testing.T) {
	cases := []Delivery{
		{},
		{V: 1, ReportID: "abc", EventID: "e", Outcome: "delivered", Attempt: 1, HTTPStatus: 200, LatencyUS: 812, At: 1700000000000},
		{V: 1, ReportID: "abc", EventID: "e", Outcome: "delivered", Attempt: 1, HTTPStatus: 200, ServedBy: "live", Partner: "https://api.partner.example/v2?x=<&>", At: 1},
		{V: 1, ReportID: "abc", Outcome: "standby", Partner: "http://127.0.0.1:8088", At: 1},
		{V: 1, ReportID: "r", Outcome: "rejected", Attempt: 3, HTTPStatus: 400, Message: "include the required fields: country,os", Fields: []string{"country", "os"}, LatencyUS: 5, TraceID: "0af7651916cd43dd8448eb211c80319c", At: 1},
		{V: 1, ReportID: "r", Outcome: "standby", ServedBy: "standby", Replay: true, Reason: "http_503", Message: "quote \" back\\slash <html> & \u00e9 \n\t\x01 \u2028", Fields: []string{}, At: -1, LatencyUS: -3},
		{V: 1, ReportID: "r", Outcome: "delivered", HTTPStatus: 200, InDoubt: true, DoubtCause: DoubtCrash, ReplayID: "rp-20261123T2130Z-1a2b", ReplayReason: "partner lost 14:02–14:40 \"standby\" <x>", At: 1},
		{V: 1, ReportID: "r", Outcome: "rejected", HTTPStatus: 400, ReplayID: "x", At: 1},
		{V: 1, EventID: "\xff invalid utf-8", Message: "partnerapi: POST /partners/royalty-tracking: transient: dial tcp: connection refused"},
	}
	for i, d := range cases {
		want, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendDelivery(nil, &d); string(got) != string(want) {
			t.Errorf("case %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

func FuzzAppendDelivery(f *testing.F) {
	f.Add("id", "event", "message", "field", "http://127.0.0.1:8088", 200, int64(5), true, "rp-1", "reason")
	f.Fuzz(func(t *testing.T, id, ev, msg, field, partner string, status int, lat int64, replay bool, replayID, replayReason string) {
		d := Delivery{V: 1, ReportID: id, EventID: ev, Outcome: "retry", Attempt: 2, HTTPStatus: status, Partner: partner, Message: msg, Fields: []string{field}, LatencyUS: lat, Replay: replay,
			ReplayID: replayID, ReplayReason: replayReason, At: lat, InDoubt: replay, DoubtCause: field}
		want, _ := json.Marshal(d)
		if got := AppendDelivery(nil, &d); string(got) != string(want) {
			t.Fatalf("got %s\nwant %s", got, want)
		}
	})
}

func BenchmarkDeliveryEncoding(b *testing.B) {
	d := Delivery{V: 1, ReportID: "0af7651916cd43dd8448eb211c80319c", EventID: "ev-123456", Outcome: "delivered", Attempt: 1, HTTPStatus: 200, LatencyUS: 812, TraceID: "0af7651916cd43dd8448eb211c80319c", At: 1700000000000}
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			_, _ = json.Marshal(d)
		}
	})
	b.Run("AppendDelivery", func(b *testing.B) {
		buf := make([]byte, 0, 512)
		for b.Loop() {
			buf = AppendDelivery(buf[:0], &d)
		}
	})
}
