package reporter

import (
	"testing"
	"time"
)

// TestSuspects: a track is suspect after suspectStalls stalls over at
// least suspectAfter with none of its posts answered in between, cleared by
// one answer, forgotten after suspectFor without a stall; posts stalling
// together (a hiccup) make no track suspect; reports without a trackid
// never are.
func TestSuspects(t *testing.T) {
	now := time.Unix(1000, 0)
	var s suspects
	s.stalled(9, now)
	s.stalled(9, now.Add(time.Millisecond))
	if s.is(9) {
		t.Fatal("suspect after two stalls within a millisecond")
	}
	if s.answered(9) {
		t.Fatal("answered says a track that was not suspect was")
	}
	s.stalled(7, now)
	if s.is(7) {
		t.Fatal("suspect after one stall")
	}
	s.stalled(7, now.Add(suspectAfter))
	if !s.is(7) || s.is(8) {
		t.Fatalf("after two stalls %v apart: 7 suspect %v (want true), 8 suspect %v (want false)", suspectAfter, s.is(7), s.is(8))
	}
	if !s.answered(7) || s.is(7) {
		t.Fatal("an answer of the track: not reported as clearing a suspect, or still suspect")
	}
	s.stalled(7, now.Add(2*time.Second))
	s.stalled(7, now.Add(3*time.Second))
	s.at = now.Add(3*time.Second + suspectFor)
	if s.is(7) {
		t.Fatalf("still suspect %v after its last stall", suspectFor)
	}
	s.stalled(0, now)
	s.stalled(0, now)
	if s.is(0) {
		t.Fatal("a report without a trackid is suspect")
	}
	// Bounded: the tracks past suspectMax are never suspect, the stale
	// ones are swept to make room.
	at := now.Add(time.Hour)
	for i := range int64(suspectMax + 10) {
		s.stalled(100+i, at)
		s.stalled(100+i, at)
	}
	if len(s.tracks) > suspectMax {
		t.Fatalf("%d tracks remembered, at most %d", len(s.tracks), suspectMax)
	}
	s.stalled(1, at.Add(suspectFor))
	s.stalled(1, at.Add(suspectFor+suspectAfter))
	if !s.is(1) || len(s.tracks) != 1 {
		t.Fatalf("after the stale ones were swept: track 1 suspect %v, %d tracks", s.is(1), len(s.tracks))
	}
}

func TestTrackKey(t *testing.T) {
	for body, want := range map[string]int64{
		`{"trackid":666,"playedat":1}`:                  666,
		`{"playedat":1, "trackid" : 42 }`:               42,
		`{"sourcedetail":"trackid","trackid":5}`:        5,
		`{"sourcedetail":"a\"trackid\":9","trackid":3}`: 3,
		`{"playedat":1}`:                                0,
		`{"trackid":"x"}`:                               0,
		`{"trackid":-4}`:                                0,
		`{"trackid":123456789012345678901234567890}`:    123456789012345678,
	} {
		if got := trackKey([]byte(body)); got != want {
			t.Errorf("trackKey(%s) = %d, want %d", body, got, want)
		}
	}
}
