package sandbox

import (
	"fmt"
	"slices"
	"strings"
)

// Catalog is the sandbox's generated content, for tests that compute the
// expected answers independently: every page, list and mix, with each mix's
// full track listing. It is built once by New from Config.Seed and never
// changes; callers must not modify it.
type Catalog struct {
	// Pages in id order (in lenient mode also their ranking order; in strict
	// mode Page.Ranking says where each is shown). The last one has no lists
	// (its page endpoint answers 400 "no results for given type" and its
	// genre row has items: null).
	Pages []Page
	// Mixes sorted by ID.
	Mixes []Mix
	// Genres are the genre rows by music row id (the page id space). A row
	// whose Items is nil is served as items: null.
	Genres map[int64]GenreRow
	// Restrictions are the content restrictions of the partner account
	// (Config.Email), applied by GET /partners/catalog/restricted to tokens
	// from /partners/session/with-user.
	Restrictions Restrictions

	// Strict is true when the catalog was built in strict mode (not
	// Config.Lenient): gapped page and list ids, shuffled rankings.
	Strict bool

	seed      int64
	mixByID   map[int64]*Mix
	listByID  map[int64]*List
	pageByID  map[int64]*Page
	trackByID map[int64]*Track
}

// Page is one catalog page (music row). Lists are in id order; their
// Ranking is their display order.
type Page struct {
	ID      int64
	Title   string
	Type    string
	Ranking int // display order, ascending (gapped and not in id order in strict mode)
	Lists   []List
}

// List is one list of a page. MixCount is what the page advertises; it may
// be larger than len(MixIDs), which is what the list endpoint returns. A list
// with no MixIDs answers 400 "no results for given type".
type List struct {
	ID          int64
	PageID      int64
	Ranking     int
	Title       string
	Description string
	MixCount    int
	Image       ImageSet
	MixIDs      []int64
}

// ImageSet is the artwork of a list.
type ImageSet struct{ Thumbnail, Large, Player string }

// DJ of a mix.
type DJ struct{ Name, ImageLarge, ImageThumbnail string }

// Genre of a mix.
type Genre struct {
	ID                 int64
	Title, Description string
}

// Mix is one mix with its full track listing.
type Mix struct {
	ID             int64
	ListID         int64
	Title          string
	Description    string
	LengthSec      int // sum of the tracks' lengths
	MinBPM, MaxBPM int
	BPM            int // representative, served in live list summaries
	Explicit       bool
	URL            string // raw MP3
	AndroidHLSURL  string
	IOSHLSURL      string
	ImageLarge     string
	ImageThumbnail string
	DJ             DJ
	Tracks         []Track // ordered by StartSec, strictly increasing
	Genres         []Genre
	Tags           []string
}

// Length is the mix length as served (HH:MM:SS).
func (m *Mix) Length() string { return hms(m.LengthSec) }

// Track is one entry of a mix's listing. A track id may appear in several
// mixes; its ISRC, title and length are the same everywhere.
type Track struct {
	ID        int64
	Time      string // HH:MM:SS start within the mix, as served
	StartSec  int    // Time in seconds
	LengthSec int    // next track's start (or the mix length) minus StartSec
	ISRC      string // byte for byte as served
	Artist    string
	Title     string
	// Quirk names what a careless client would mangle in ISRC ("" for a
	// plain one): see the ISRCQuirk constants.
	Quirk ISRCQuirk
}

// ISRCQuirk is a deliberate oddity of a served ISRC.
type ISRCQuirk string

// The ISRC quirks the catalog always contains (each on at least one track of
// at least one mix).
const (
	QuirkNone          ISRCQuirk = ""
	QuirkLowercase     ISRCQuirk = "lowercase"      // "usabc2412345"
	QuirkHyphenated    ISRCQuirk = "hyphenated"     // "US-ABC-24-12345"
	QuirkTrailingSpace ISRCQuirk = "trailing-space" // "USABC2412345 "
	QuirkShared        ISRCQuirk = "shared"         // the same ISRC on two different track ids
	QuirkEmpty         ISRCQuirk = "empty"          // "" (the service looks it up from trackid)
)

// GenreRow is GET /partners/genres/{id}. Items nil is served as null.
// Items are in generation order; Ordering is their display order.
type GenreRow struct {
	ID    int64
	Items []GenreItem
}

// GenreItem is one item of a genre row; ID is a mix id.
type GenreItem struct {
	ID                               int64
	Title, Description               string
	BPM                              int
	Image, ImageWideURL, PlayerImage string
	Thumbnail, BasicImage, WideImage string
	SpotlightImage                   string
	Ordering                         int
}

// Restrictions of the partner account, applied to with-user tokens.
type Restrictions struct {
	// BlockedTypes are page types hidden in every country.
	BlockedTypes []string
	// BlockedByCountry are page ids hidden for one country (uppercase ISO code).
	BlockedByCountry map[string][]int64
	// NoneCountries are countries where nothing is available (400 "no
	// catalogs available for this partner").
	NoneCountries []string
}

// Mix returns the mix with the given id.
func (c *Catalog) Mix(id int64) (*Mix, bool) { m, ok := c.mixByID[id]; return m, ok }

// Track returns the track with the given id (its ISRC and length are the same
// in every mix it appears in).
func (c *Catalog) Track(id int64) (*Track, bool) { t, ok := c.trackByID[id]; return t, ok }

// List returns the list with the given id.
func (c *Catalog) List(id int64) (*List, bool) { l, ok := c.listByID[id]; return l, ok }

// Page returns the page with the given id.
func (c *Catalog) Page(id int64) (*Page, bool) { p, ok := c.pageByID[id]; return p, ok }

// MixIDs returns every mix id in ascending order.
func (c *Catalog) MixIDs() []int64 {
	ids := make([]int64, len(c.Mixes))
	for i := range c.Mixes {
		ids[i] = c.Mixes[i].ID
	}
	return ids
}

// TracksWithQuirk returns the tracks (one entry per track id) whose ISRC has the quirk.
func (c *Catalog) TracksWithQuirk(q ISRCQuirk) []Track {
	var out []Track
	for _, id := range sortedKeys(c.trackByID) {
		if t := c.trackByID[id]; t.Quirk == q {
			out = append(out, *t)
		}
	}
	return out
}

// MixContaining returns a mix whose listing contains the track id, and the
// track's position in it.
func (c *Catalog) MixContaining(trackID int64) (*Mix, int, bool) {
	for i := range c.Mixes {
		for j := range c.Mixes[i].Tracks {
			if c.Mixes[i].Tracks[j].ID == trackID {
				return &c.Mixes[i], j, true
			}
		}
	}
	return nil, 0, false
}

// RestrictedPages returns the pages the restricted catalog serves to a
// with-user token for country ("" when no valid EDGE-IPCountry was sent).
func (c *Catalog) RestrictedPages(country string) []Page {
	country = strings.ToUpper(country)
	if slices.Contains(c.Restrictions.NoneCountries, country) {
		return nil
	}
	blocked := c.Restrictions.BlockedByCountry[country]
	var out []Page
	for _, p := range c.Pages {
		if slices.Contains(c.Restrictions.BlockedTypes, p.Type) || slices.Contains(blocked, p.ID) {
			continue
		}
		out = append(out, p)
	}
	return out
}

func sortedKeys[V any](m map[int64]V) []int64 {
	ks := make([]int64, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func hms(sec int) string {
	return fmt.Sprintf("%02d:%02d:%02d", sec/3600, sec/60%60, sec%60)
}

// wireOrder returns the order (indexes into keys) in which a ranked
// collection is served: as given in lenient mode; in strict mode a shuffle,
// deterministic from the seed and salt, that is never ascending by key
// (n ≥ 2), so a client that does not sort by the rank shows a wrong order.
func (c *Catalog) wireOrder(keys []int, salt uint64) []int {
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	if !c.Strict || len(idx) < 2 {
		return idx
	}
	strictRand(c.seed, salt).Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	if slices.IsSortedFunc(idx, func(a, b int) int { return keys[a] - keys[b] }) {
		idx = append(idx[1:], idx[0]) // rotated: no longer ascending (keys are distinct)
	}
	return idx
}
