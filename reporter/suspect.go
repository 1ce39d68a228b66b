package reporter

import (
	"bytes"
	"time"
)

// Suspect tracks. A partner that hangs on one payload (a gateway holding
// every report of one track until our --api-timeout) costs each post of it
// a worker, a connection and a slot of MaxConcurrency for the whole
// timeout. Stalled posts leave the in-flight limit (limit.go), and reports
// that failed before hold at most retryCap slots (lease.go), but a fresh
// report of that track has not failed yet: without more, each one holds
// its slot for the timeout before the retry share covers it. At 7 000
// reports a second with 2.5 % of them of one hanging track, that is ~5 000
// posts held at once, far over MaxConcurrency: the others would get none.
//
// So a track whose posts stall while the partner answers the others is
// suspect: suspectStalls of its posts stalled (limiter.advance: out longer
// than stallAfter while posts started after them were answered at the
// usual latency), none of its posts answered normally since, and the first
// of those stalls at least suspectAfter ago — a busy healthy track whose
// posts stall together in a scheduling hiccup is answered again within
// milliseconds and never becomes suspect. A fresh report of a suspect
// track is posted only within its own share, suspectCap (suspectShare of
// the limit, at least 1; its posts that stalled, up to suspectRoomShare of
// the room between the limit and MaxConcurrency, not counted: stalled
// posts use that room); over it, the report waits aside (run.aside)
// while the other fresh reports go on. Its first failure makes it a
// retry like any other (the retries' share, its budget, parking). One
// post of the track answered normally clears the track at once, and its
// reports aside go back to the queue (releaseAside); a track with no
// stall for suspectFor is forgotten.
//
// Suspicion changes which slots a fresh report waits for, and one thing
// more: a suspect track has a retry budget of its own, spent by its
// reports' failures together (failed), or by one report spending its
// whole budget (parkedOne): the track hangs for good, and its reports are
// parked without another post where they wait, those out at their failure
// (parkhang.go, budgetSpent), instead of each spending a budget of its
// own — at the default budget (20 failures over 10 minutes)
// and timeout (30 s), a thousand hanging reports would need a thousand
// slots for ten minutes, far more than the suspect share and the stalled
// room give them: with 1 200 of them the oldest had failed 4 times after
// 10 minutes. No move of the limit follows from suspicion. A real overload or
// outage makes no track suspect: with no post started later answered, or
// the answers slow (limiter.answersFast), no post counts as stalled, and
// the limit shrinks as before. Posts held at random (1 % of all posts,
// any track) rarely stall twice in a row on one track; a track made
// suspect by chance is cleared by its next post answered.
//
// The key is the report's trackid (trackKey): the payload a royalty
// partner keys its processing on. A report whose body has no integer
// trackid is never suspect.

const (
	suspectStalls    = 2               // stalled posts of a track, none answered since …
	suspectAfter     = time.Second     // … the first this long ago: suspect
	suspectFor       = 2 * time.Minute // a track with no stall for this long is forgotten
	suspectMax       = 4096            // tracks remembered at most (the rest are never suspect)
	suspectShare     = 0.125           // the share of the limit fresh reports of suspect tracks may hold …
	suspectRoomShare = 0.25            // … and of the room between the limit and MaxConcurrency, stalled
)

// suspectTrack is what is known of one track whose posts stalled.
type suspectTrack struct {
	stalls int       // posts stalled since one of the track's was answered normally
	since  time.Time // the first of them
	last   time.Time // the last stall
	// parked: a report of the track spent its whole retry budget while
	// the track was suspect (parkedOne), or its reports together did
	// (failed: fails since firstFail): the track hangs for good, and its
	// other reports are parked without another post (parkhang.go).
	parked    bool
	fails     int
	firstFail time.Time
}

// suspects is the tracks whose posts stalled (under run.mu, in the
// limiter: it sees the stalls). It reads no clock: at is the time of the
// limiter's last input.
type suspects struct {
	tracks map[int64]suspectTrack
	at     time.Time
	swept  time.Time
}

// stalled records that a post of track stalled at now.
func (s *suspects) stalled(track int64, now time.Time) {
	if track <= 0 {
		return
	}
	s.at = now
	if s.tracks == nil {
		s.tracks = map[int64]suspectTrack{}
	}
	st, known := s.tracks[track]
	if !known && (len(s.tracks) >= suspectMax || now.Sub(s.swept) >= suspectFor) {
		s.sweep(now)
		if len(s.tracks) >= suspectMax {
			return
		}
	}
	if st.stalls == 0 {
		st.since = now
	}
	st.stalls++
	st.last = now
	s.tracks[track] = st
}

// answered records that a post of track was answered normally: the track
// is not hanging (any more). It reports whether the track was suspect.
func (s *suspects) answered(track int64) (was bool) {
	if len(s.tracks) == 0 {
		return false
	}
	was = s.is(track)
	delete(s.tracks, track)
	return was
}

// is reports whether track is suspect now.
func (s *suspects) is(track int64) bool {
	if len(s.tracks) == 0 || track <= 0 {
		return false
	}
	st, ok := s.tracks[track]
	return ok && st.stalls >= suspectStalls && s.at.Sub(st.since) >= suspectAfter && s.at.Sub(st.last) < suspectFor
}

// parkedOne records that a report of track spent its retry budget; it
// counts only while the track is suspect.
func (s *suspects) parkedOne(track int64) {
	if s.is(track) {
		st := s.tracks[track]
		st.parked = true
		s.tracks[track] = st
	}
}

// failed counts a failure of a report of track toward the track's own
// budget while the track is suspect: attempts failures over after (the
// reports' budget, Config.ParkAfterAttempts and ParkAfter) make it hang.
// A failure keeps a suspect track remembered like a stall: when nothing
// else is posted (its partitions leased up to their progress windows
// behind its reports) no post stalls, and the track must not be forgotten.
func (s *suspects) failed(track int64, now time.Time, attempts int, after time.Duration) {
	if attempts < 0 || !s.is(track) {
		return
	}
	s.at = maxTime(s.at, now)
	st := s.tracks[track]
	if st.fails == 0 {
		st.firstFail = now
	}
	st.fails++
	st.last = now
	if st.fails >= attempts && now.Sub(st.firstFail) >= after {
		st.parked = true
	}
	s.tracks[track] = st
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// hangs reports whether track is suspect and its reports spent its retry
// budget since its posts began to stall (one report alone, or together).
func (s *suspects) hangs(track int64) bool {
	return s.is(track) && s.tracks[track].parked
}

// count is how many tracks are suspect now (metrics).
func (s *suspects) count() int {
	n := 0
	for t := range s.tracks {
		if s.is(t) {
			n++
		}
	}
	return n
}

// sweep forgets the tracks with no stall for suspectFor.
func (s *suspects) sweep(now time.Time) {
	s.swept = now
	for t, st := range s.tracks {
		if now.Sub(st.last) >= suspectFor {
			delete(s.tracks, t)
		}
	}
}

// trackKey is the trackid of a report body: the integer after the first
// "trackid" key, 0 when there is none (never suspect). A cheap scan, not a
// parse (intake's hot path): a body it misreads only loses or shares the
// slot rule of its track, never a report. The stall and park warnings name
// tracks by it too, so a warning's tracks are the suspect rule's.
func trackKey(body []byte) int64 {
	for rest := body; ; {
		i := bytes.Index(rest, []byte(`"trackid"`))
		if i < 0 {
			return 0
		}
		rest = rest[i+len(`"trackid"`):]
		k := 0
		for k < len(rest) && isJSONSpace(rest[k]) {
			k++
		}
		if k == len(rest) || rest[k] != ':' {
			continue // "trackid" as a value, not a key
		}
		for k++; k < len(rest) && isJSONSpace(rest[k]); k++ {
		}
		var v int64
		digits := 0
		for ; k < len(rest) && rest[k] >= '0' && rest[k] <= '9' && digits < 18; k++ {
			v = v*10 + int64(rest[k]-'0')
			digits++
		}
		if digits == 0 {
			return 0
		}
		return v
	}
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// suspectCap is how many fresh reports of suspect tracks may hold a slot
// at once, leased or in flight (mu held): suspectShare of the in-flight
// limit, at least 1. Their posts that stalled hold none (suspectsHeld), up
// to suspectRoomShare of the room between the limit and MaxConcurrency:
// at a small limit the track's first attempts are not starved, so its
// reports reach their budgets about as soon as without the rule, and never
// more than the share of the limit is held by its posts not stalled.
func (rn *run) suspectCap() int { return max(1, int(rn.thr.lim.limit*suspectShare)) }

// suspectsHeld is how many of the suspect slots are held (mu held): the
// suspect tracks' fresh reports leased or in flight, but those stalled
// (limiter.stalledSuspectsOut).
func (rn *run) suspectsHeld() int { return rn.suspectSlots - rn.thr.lim.stalledSuspectsOut() }

// releaseAside puts the reports aside whose track is no longer suspect
// back in the queue (mu held): a track answered again, or forgotten.
func (rn *run) releaseAside() {
	n := rn.aside.len()
	if n == 0 {
		return
	}
	var keep fifo
	released := false
	for range n {
		j := rn.aside.pop()
		if rn.thr.lim.sus.is(j.track) {
			keep.push(j)
			continue
		}
		rn.ready.push(j)
		released = true
	}
	rn.aside = keep
	if released {
		rn.jobsReady()
	}
}
