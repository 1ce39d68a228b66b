package consumer

import (
	"testing"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

const t0 = int64(1_700_000_000_000) // started_at of the test events

func ptr[T any](v T) *T { return &v }

// testMix: A [0:00, 3:00), B [3:00, 7:30), C [7:30, 10:00).
func testMix() partnerapi.Mix {
	return partnerapi.Mix{ID: 42, Title: "Morning <Run> & \"Sprint\"", Length: "00:10:00", Tracks: []partnerapi.Track{
		{ID: 11, Time: "00:00:00", ISRC: "GBAYE0601498"},
		{ID: 12, Time: "00:03:00", ISRC: " us-s1z-99-00001\u00a0"}, // odd bytes kept as served
		{ID: 13, Time: "00:07:30"},                                 // no isrc
	}}
}

func testEvent(offset, dur int64) schemas.PlayerEvent {
	return schemas.PlayerEvent{EventID: "ev-1", MixID: 42, StartedAt: t0, OffsetMS: offset, DurationMS: dur,
		UserID: "u-1", Country: "DE", OS: "iOS 17.4", Device: "phone", Vendor: ptr(int64(7)), SourceStream: "mix"}
}

type wantPlay struct {
	pos      int
	trackID  int64
	isrc     string
	playedAt int64 // minus t0
	overlap  int64
	below    bool
}

func TestSplit(t *testing.T) {
	unsorted := partnerapi.Mix{ID: 42, Title: "u", Length: "00:10:00", Tracks: []partnerapi.Track{
		{ID: 13, Time: "00:07:30", ISRC: "C"},
		{ID: 11, Time: "00:00:00", ISRC: "A"},
		{ID: 12, Time: "00:03:00", ISRC: "B"},
		{ID: 14, Time: "00:03:00", ISRC: "D"}, // same start as B: B spans zero ms
	}}
	lateStart := partnerapi.Mix{ID: 42, Title: "l", Length: "00:05:00", Tracks: []partnerapi.Track{
		{ID: 21, Time: "00:00:30", ISRC: "X"},
		{ID: 22, Time: "00:02:00", ISRC: "Y"},
	}}
	badTime := testMix()
	badTime.Tracks = append([]partnerapi.Track(nil), badTime.Tracks...)
	badTime.Tracks[1].Time = "00:03:xx"
	badLength := testMix()
	badLength.Length = "ten minutes"

	cases := []struct {
		name     string
		mix      partnerapi.Mix
		offset   int64
		dur      int64
		minPlay  int64
		want     []wantPlay
		rejected string
	}{
		{name: "inside one track", mix: testMix(), offset: 10_000, dur: 60_000,
			want: []wantPlay{{0, 11, "GBAYE0601498", 0, 60_000, false}}},
		{name: "across several", mix: testMix(), offset: 170_000, dur: 300_000,
			want: []wantPlay{
				{0, 11, "GBAYE0601498", 0, 10_000, false},
				{1, 12, " us-s1z-99-00001\u00a0", 10_000, 270_000, false},
				{2, 13, "", 280_000, 20_000, false},
			}},
		{name: "starting mid-track", mix: testMix(), offset: 200_000, dur: 30_500,
			want: []wantPlay{{1, 12, " us-s1z-99-00001\u00a0", 0, 30_500, false}}},
		{name: "exactly one track", mix: testMix(), offset: 180_000, dur: 270_000,
			want: []wantPlay{{1, 12, " us-s1z-99-00001\u00a0", 0, 270_000, false}}},
		{name: "running past the mix end", mix: testMix(), offset: 590_000, dur: 60_000,
			want: []wantPlay{{2, 13, "", 0, 10_000, false}}},
		{name: "whole mix and more", mix: testMix(), offset: 0, dur: 3_600_000,
			want: []wantPlay{
				{0, 11, "GBAYE0601498", 0, 180_000, false},
				{1, 12, " us-s1z-99-00001\u00a0", 180_000, 270_000, false},
				{2, 13, "", 450_000, 150_000, false},
			}},
		{name: "under the minimum", mix: testMix(), offset: 179_500, dur: 1_499,
			want: []wantPlay{
				{0, 11, "GBAYE0601498", 0, 500, true},
				{1, 12, " us-s1z-99-00001\u00a0", 500, 999, true},
			}},
		{name: "exactly the minimum", mix: testMix(), offset: 179_000, dur: 2_000,
			want: []wantPlay{
				{0, 11, "GBAYE0601498", 0, 1_000, false},
				{1, 12, " us-s1z-99-00001\u00a0", 1_000, 1_000, false},
			}},
		{name: "configured minimum 30s", mix: testMix(), offset: 150_000, dur: 59_999, minPlay: 30_000,
			want: []wantPlay{
				{0, 11, "GBAYE0601498", 0, 30_000, false},
				{1, 12, " us-s1z-99-00001\u00a0", 30_000, 29_999, true},
			}},
		{name: "minimum disabled", mix: testMix(), offset: 179_900, dur: 200, minPlay: -1,
			want: []wantPlay{
				{0, 11, "GBAYE0601498", 0, 100, false},
				{1, 12, " us-s1z-99-00001\u00a0", 100, 100, false},
			}},
		{name: "zero duration", mix: testMix(), offset: 10_000, dur: 0, want: nil},
		// The split rule (docs/design.md): a segment starting at or past the mix end
		// overlaps no track: a valid event with zero plays, not a rejection.
		{name: "offset at the mix end", mix: testMix(), offset: 600_000, dur: 1_000, want: nil},
		{name: "offset beyond the mix", mix: testMix(), offset: 900_000, dur: 1_000, want: nil},
		{name: "unsorted and duplicate times", mix: unsorted, offset: 0, dur: 600_000,
			want: []wantPlay{
				{1, 11, "A", 0, 180_000, false},
				{3, 14, "D", 180_000, 270_000, false},
				{0, 13, "C", 450_000, 150_000, false},
			}},
		{name: "segment inside a zero-length track's instant", mix: unsorted, offset: 180_000, dur: 5_000,
			want: []wantPlay{{3, 14, "D", 0, 5_000, false}}},
		{name: "first track starts after 0", mix: lateStart, offset: 0, dur: 60_000,
			want: []wantPlay{{0, 21, "X", 30_000, 30_000, false}}},
		{name: "segment before the first track", mix: lateStart, offset: 0, dur: 20_000, want: nil},
		{name: "unparseable track time", mix: badTime, offset: 0, dur: 10_000, rejected: ReasonBadListing},
		{name: "unparseable mix length", mix: badLength, offset: 0, dur: 10_000, rejected: ReasonBadListing},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := PrepareListing(tc.mix, partnerapi.Meta{Status: 200})
			ev := testEvent(tc.offset, tc.dur)
			plays, v := Split(nil, &ev, l, SplitOptions{MinPlayMS: tc.minPlay, DerivedAt: 99})
			if tc.rejected != "" {
				if v == nil || v.Reason != tc.rejected {
					t.Fatalf("want rejection %s, got violation %v and %d plays", tc.rejected, v, len(plays))
				}
				if len(plays) != 0 {
					t.Fatalf("rejected event yielded %d plays", len(plays))
				}
				return
			}
			if v != nil {
				t.Fatalf("unexpected violation %v", v)
			}
			if len(plays) != len(tc.want) {
				t.Fatalf("got %d plays, want %d: %+v", len(plays), len(tc.want), plays)
			}
			for i, w := range tc.want {
				p := plays[i]
				r := p.Report
				if p.Position != w.pos || r.TrackID != w.trackID || r.ISRC != w.isrc || r.PlayedAt != t0+w.playedAt ||
					p.OverlapMS != w.overlap || r.PlayLength != w.overlap/1000 || p.BelowMinimum != w.below {
					t.Errorf("play %d: got pos=%d track=%d isrc=%q playedat=+%d overlap=%d playlength=%d below=%v; want %+v",
						i, p.Position, r.TrackID, r.ISRC, r.PlayedAt-t0, p.OverlapMS, r.PlayLength, p.BelowMinimum, w)
				}
				if p.ReportID != schemas.ReportID("ev-1", w.pos) || p.EventID != "ev-1" || p.MixID != 42 || p.V != schemas.TrackPlayVersion || p.DerivedAt != 99 {
					t.Errorf("play %d: ids %+v", i, p)
				}
				if r.SourceDetail != tc.mix.Title || r.SourceStream != "mix" || r.UserID != "u-1" || r.Country != "DE" ||
					r.OS != "iOS 17.4" || r.Device != "phone" || r.Vendor != 7 {
					t.Errorf("play %d: event fields not carried: %+v", i, r)
				}
				if r.CachedPlay != nil || r.JumpForward != nil || r.EndReason != nil {
					t.Errorf("play %d: absent optional fields must stay absent: %+v", i, r)
				}
			}
		})
	}
}

func TestSplitOptionalFields(t *testing.T) {
	l := PrepareListing(testMix(), partnerapi.Meta{})
	for _, tc := range []struct {
		name    string
		cached  *bool
		jump    *bool
		end     *int64
		offset  int64
		dur     int64
		nPlays  int
		checkFn func(t *testing.T, plays []schemas.TrackPlay)
	}{
		{name: "present false and 0 are passed on", cached: ptr(false), jump: ptr(false), end: ptr(int64(0)), offset: 170_000, dur: 300_000, nPlays: 3},
		{name: "true values", cached: ptr(true), jump: ptr(true), end: ptr(int64(3)), offset: 170_000, dur: 300_000, nPlays: 3},
		{name: "one play gets both ends", cached: ptr(true), jump: ptr(true), end: ptr(int64(2)), offset: 10_000, dur: 1_000, nPlays: 1},
		{name: "below-minimum first and last still carry them", cached: ptr(false), jump: ptr(true), end: ptr(int64(5)), offset: 179_500, dur: 270_800, nPlays: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := testEvent(tc.offset, tc.dur)
			ev.Cached, ev.JumpForward, ev.EndReason = tc.cached, tc.jump, tc.end
			plays, v := Split(nil, &ev, l, SplitOptions{})
			if v != nil || len(plays) != tc.nPlays {
				t.Fatalf("got %d plays, violation %v", len(plays), v)
			}
			for i, p := range plays {
				r := p.Report
				if r.CachedPlay == nil || *r.CachedPlay != *tc.cached {
					t.Errorf("play %d: cachedplay %v, want %v on every play", i, r.CachedPlay, *tc.cached)
				}
				if i == 0 {
					if r.JumpForward == nil || *r.JumpForward != *tc.jump {
						t.Errorf("first play: jumpforward %v, want %v", r.JumpForward, *tc.jump)
					}
				} else if r.JumpForward != nil {
					t.Errorf("play %d: jumpforward must be only on the first play", i)
				}
				if i == len(plays)-1 {
					if r.EndReason == nil || *r.EndReason != *tc.end {
						t.Errorf("last play: endreason %v, want %v", r.EndReason, *tc.end)
					}
				} else if r.EndReason != nil {
					t.Errorf("play %d: endreason must be only on the last play", i)
				}
			}
		})
	}
}

func TestSplitMisc(t *testing.T) {
	// No user id (let through by policy) is flagged; a standby listing too;
	// a default source stream comes from the event as parsed.
	l := PrepareListing(testMix(), partnerapi.Meta{Status: 200, ServedBy: partnerapi.ServedStandby})
	ev := testEvent(0, 5_000)
	ev.UserID = ""
	ev.SourceStream = "radio"
	plays, v := Split(nil, &ev, l, SplitOptions{})
	if v != nil || len(plays) != 1 {
		t.Fatalf("got %v %v", plays, v)
	}
	p := plays[0]
	if !p.NoUserID || !p.StandbyListing || p.Report.UserID != "" || p.Report.SourceStream != "radio" {
		t.Fatalf("flags: %+v", p)
	}
	// Split appends to dst.
	plays, _ = Split(plays, &ev, l, SplitOptions{})
	if len(plays) != 2 || plays[0].ReportID != plays[1].ReportID {
		t.Fatalf("append: %d plays", len(plays))
	}
	// OmitReportID leaves only the id out.
	omitted, _ := Split(nil, &ev, l, SplitOptions{OmitReportID: true})
	if omitted[0].ReportID != "" || omitted[0].Report != plays[0].Report {
		t.Fatalf("OmitReportID: %+v", omitted[0])
	}
	// An empty listing yields no play and no violation.
	empty := PrepareListing(partnerapi.Mix{ID: 1, Length: "00:01:00"}, partnerapi.Meta{})
	if plays, v := Split(nil, &ev, empty, SplitOptions{}); len(plays) != 0 || v != nil {
		t.Fatalf("empty listing: %v %v", plays, v)
	}
}
