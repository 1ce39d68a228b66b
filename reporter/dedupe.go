package reporter

import (
	"crypto/sha256"
	"encoding/hex"
)

// recentSet remembers the report ids of the last capacity reports that got a
// final outcome, so that a report seen again within that window (a
// re-published event yields the same report ids) is not posted twice.
//
// Memory is bounded: each id is kept as 16 bytes (the 32 hex characters of a
// schemas.ReportID decoded; any other id hashed with SHA-256), in a map plus
// a ring buffer that evicts the oldest id first. About 60 bytes per id, so the
// default window of 100 000 ids costs about 6 MB. Not safe for concurrent use.
type recentSet struct {
	ids  map[[16]byte]struct{}
	ring [][16]byte
	next int
	full bool
}

func newRecentSet(capacity int) *recentSet {
	if capacity <= 0 {
		return &recentSet{}
	}
	return &recentSet{ids: make(map[[16]byte]struct{}, capacity), ring: make([][16]byte, capacity)}
}

func idKey(id string) [16]byte {
	var k [16]byte
	if len(id) == 32 {
		if _, err := hex.Decode(k[:], []byte(id)); err == nil {
			return k
		}
	}
	sum := sha256.Sum256([]byte(id))
	copy(k[:], sum[:16])
	return k
}

// add remembers id, evicting the oldest id when the window is full.
func (s *recentSet) add(id string) {
	if len(s.ring) == 0 {
		return
	}
	k := idKey(id)
	if _, ok := s.ids[k]; ok {
		return
	}
	if s.full {
		delete(s.ids, s.ring[s.next])
	}
	s.ring[s.next] = k
	s.ids[k] = struct{}{}
	s.next++
	if s.next == len(s.ring) {
		s.next, s.full = 0, true
	}
}

// has reports whether id got a final outcome within the window.
func (s *recentSet) has(id string) bool {
	if len(s.ring) == 0 {
		return false
	}
	_, ok := s.ids[idKey(id)]
	return ok
}
