package consumer

import (
	"sort"
	"strconv"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

// ReasonBadListing is the rejection reason of an event whose mix the partner
// API served with a track listing that cannot be split: a track time or the
// mix length is not HH:MM:SS. The event keeps its raw bytes in
// <prefix>.rejected so it can be replayed once the listing is fixed; the
// consumer never guesses which track was playing.
const ReasonBadListing = "bad_mix_listing"

// DefaultMinPlayLength is the default minimum play length: shorter plays are
// derived and counted (TrackPlay.BelowMinimum) but never posted.
const DefaultMinPlayLength int64 = 1000 // ms

// ListedTrack is one track of a prepared listing.
type ListedTrack struct {
	ID       int64
	ISRC     string // byte for byte as served
	Position int    // index in the listing as the API served it
	StartMS  int64
	EndMS    int64 // start of the next track in time order, or the mix length
}

// Listing is a mix prepared for splitting: tracks ordered by time (stable
// for ties), each with its span. It is immutable once built.
type Listing struct {
	MixID    int64
	Title    string
	LengthMS int64
	Tracks   []ListedTrack
	// Standby is true when the standby layer served the mix.
	Standby bool
	// Bad, when non-nil, says why the listing cannot be split (reason
	// ReasonBadListing); every event of this mix is rejected with it.
	Bad *schemas.Violation
}

// PrepareListing parses the mix's length and track times and orders the
// tracks by time, keeping listing order among equal times. Track k spans
// [start_k, start_k+1); the last ends at the mix length. Of tracks sharing a
// start time, all but the last in listing order span zero milliseconds and
// so never yield a play.
func PrepareListing(m partnerapi.Mix, meta partnerapi.Meta) *Listing {
	l := &Listing{MixID: m.ID, Title: m.Title, Standby: meta.Standby()}
	length, err := partnerapi.ParseHMS(m.Length)
	if err != nil {
		l.Bad = &schemas.Violation{Field: "mix.length", Reason: ReasonBadListing,
			Detail: "mix " + strconv.FormatInt(m.ID, 10) + " length " + strconv.Quote(trunc(m.Length, 24)) + " is not HH:MM:SS"}
		return l
	}
	l.LengthMS = length
	l.Tracks = make([]ListedTrack, len(m.Tracks))
	for i, t := range m.Tracks {
		start, err := partnerapi.ParseHMS(t.Time)
		if err != nil {
			l.Bad = &schemas.Violation{Field: "mix.tracks[" + strconv.Itoa(i) + "].time", Reason: ReasonBadListing,
				Detail: "mix " + strconv.FormatInt(m.ID, 10) + " track " + strconv.FormatInt(t.ID, 10) + " time " + strconv.Quote(trunc(t.Time, 24)) + " is not HH:MM:SS"}
			l.Tracks = nil
			return l
		}
		l.Tracks[i] = ListedTrack{ID: t.ID, ISRC: t.ISRC, Position: i, StartMS: start}
	}
	sort.SliceStable(l.Tracks, func(a, b int) bool { return l.Tracks[a].StartMS < l.Tracks[b].StartMS })
	for k := range l.Tracks {
		if k+1 < len(l.Tracks) {
			l.Tracks[k].EndMS = l.Tracks[k+1].StartMS
		} else {
			l.Tracks[k].EndMS = max(length, l.Tracks[k].StartMS)
		}
	}
	return l
}

// SplitOptions are the deployment's split settings.
type SplitOptions struct {
	// MinPlayMS is the minimum play length in ms; plays with a shorter
	// overlap are marked BelowMinimum. Zero means DefaultMinPlayLength; a
	// negative value disables the minimum.
	MinPlayMS int64
	// DerivedAt is stamped on every play (epoch ms).
	DerivedAt int64
	// EventAt is the Kafka timestamp (epoch ms) of the event record split,
	// stamped on each of its plays (TrackPlay.EventAt); 0 leaves it out.
	EventAt int64
	// OmitReportID leaves TrackPlay.ReportID empty (the enricher computes
	// the same id into its byte arena, saving two allocations per play).
	OmitReportID bool
}

// Split applies the split rule to one valid event and the listing of its
// mix, appending one TrackPlay per track the segment overlaps by more than
// 0 ms to dst (in time order) and returning it. It returns a violation
// instead when the listing cannot be split (ReasonBadListing). A segment of
// zero duration, or one that starts at or after the end of the mix (clipped
// to nothing), overlaps no track and yields no play: by the split rule (docs/design.md) it is a
// valid event with zero plays, not a rejection (docs/consumer.md).
//
// Optional event fields are carried as the rule says: cachedplay on every
// play, jumpforward on the first play of the segment, endreason on the last
// (a present false or 0 is passed on; an absent one is omitted). First and
// last count every derived play, including plays below the minimum, so the
// flags stay on the track they describe.
func Split(dst []schemas.TrackPlay, ev *schemas.PlayerEvent, l *Listing, opts SplitOptions) ([]schemas.TrackPlay, *schemas.Violation) {
	if l.Bad != nil {
		return dst, l.Bad
	}
	minPlay := opts.MinPlayMS
	if minPlay == 0 {
		minPlay = DefaultMinPlayLength
	}
	segStart := ev.OffsetMS
	segEnd := min(ev.OffsetMS+max(ev.DurationMS, 0), l.LengthMS)
	if segEnd <= segStart {
		return dst, nil
	}
	// The first track that may overlap: the last one starting at or before
	// segStart, found by binary search over the sorted starts.
	tracks := l.Tracks
	i := sort.Search(len(tracks), func(k int) bool { return tracks[k].StartMS > segStart })
	if i > 0 {
		i--
	}
	first := len(dst)
	vendor := int64(0)
	if ev.Vendor != nil {
		vendor = *ev.Vendor
	}
	for ; i < len(tracks) && tracks[i].StartMS < segEnd; i++ {
		t := &tracks[i]
		overlap := min(segEnd, t.EndMS) - max(segStart, t.StartMS)
		if overlap <= 0 {
			continue
		}
		var id string
		if !opts.OmitReportID {
			id = schemas.ReportID(ev.EventID, t.Position)
		}
		dst = append(dst, schemas.TrackPlay{
			V:              schemas.TrackPlayVersion,
			ReportID:       id,
			EventID:        ev.EventID,
			MixID:          ev.MixID,
			Position:       t.Position,
			OverlapMS:      overlap,
			BelowMinimum:   overlap < minPlay,
			NoUserID:       ev.UserID == "",
			StandbyListing: l.Standby,
			DerivedAt:      opts.DerivedAt,
			EventAt:        opts.EventAt,
			Report: schemas.PlayReport{
				TrackID:      t.ID,
				PlayedAt:     ev.StartedAt + max(0, t.StartMS-ev.OffsetMS),
				PlayLength:   overlap / 1000,
				SourceStream: ev.SourceStream,
				SourceDetail: l.Title,
				OS:           ev.OS,
				Device:       ev.Device,
				Country:      ev.Country,
				Vendor:       vendor,
				UserID:       ev.UserID,
				ISRC:         t.ISRC,
				CachedPlay:   ev.Cached,
			},
		})
	}
	if len(dst) > first {
		dst[first].Report.JumpForward = ev.JumpForward
		dst[len(dst)-1].Report.EndReason = ev.EndReason
	}
	return dst, nil
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
