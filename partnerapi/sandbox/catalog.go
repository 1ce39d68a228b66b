package sandbox

import (
	"fmt"
	"math/rand/v2"
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

// Identifier bases: distinct ranges make a swapped id obvious in a test failure.
const (
	pageIDBase  = 100
	listIDBase  = 2000
	mixIDBase   = 30000
	trackIDBase = 400000
)

var (
	words      = []string{"Velocity", "Summit", "Pulse", "Ember", "Tempo", "Horizon", "Drive", "Cadence", "Surge", "Rally", "Forge", "Glow", "Apex", "Flow", "Sprint", "Climb", "Pace", "Ignite", "Stride", "Echo"}
	genreNames = []string{"House", "Pop", "Hip-Hop", "Rock", "Drum & Bass", "Latin", "Techno", "Disco", "R&B", "Trance", "Indie", "Afrobeats"}
	djNames    = []string{"DJ Kilowatt", "Mara Vance", "The Interval", "Sol Ortega", "Nightshift", "Kenji Park", "Lumen", "Ada Reyes"}
	tagWords   = []string{"cycling", "running", "hiit", "strength", "warmup", "cooldown", "yoga", "rowing", "tabata", "endurance"}
	pageTypes  = []string{"featured", "genre", "workout", "explicit", "decade", "instructor"}
	countries  = []string{"US", "GB", "DE", "FR", "SE", "NL", "CA", "AU", "JP", "BR"}
)

const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func newCatalog(o Config) *Catalog {
	r := rand.New(rand.NewPCG(uint64(o.Seed), 0x706c61797069706)) //nolint:gosec // deterministic fixtures, not security
	pick := func(s []string) string { return s[r.IntN(len(s))] }
	phrase := func() string { return pick(words) + " " + pick(words) }

	// Strict mode draws its ids and rankings from a stream of its own, so
	// that the content (titles, tracks, mix and track ids) is the same in
	// both modes.
	var sr *rand.Rand
	if !o.Lenient {
		sr = strictRand(o.Seed, 0)
	}
	pageIDs := idSeq(pageIDBase, o.Pages+1, sr)
	listIDs := idSeq(listIDBase, o.Pages*o.ListsPerPage, sr)

	c := &Catalog{
		Strict:    !o.Lenient,
		seed:      o.Seed,
		Genres:    map[int64]GenreRow{},
		mixByID:   map[int64]*Mix{},
		listByID:  map[int64]*List{},
		pageByID:  map[int64]*Page{},
		trackByID: map[int64]*Track{},
	}

	// Mix shells first: how many tracks each has decides the track pool size.
	nMixes := o.Pages * o.ListsPerPage * o.MixesPerList
	counts := make([]int, nMixes)
	slots := 0
	for i := range counts {
		counts[i] = 8 + r.IntN(18) // 8–25 tracks
		slots += counts[i]
	}
	// A pool smaller than the slots, so that some tracks recur across mixes.
	// At least 25 tracks, so that any mix can be filled without repeats.
	pool := make([]Track, max(slots*3/4, 25))
	for i := range pool {
		pool[i] = Track{
			ID:        int64(trackIDBase + 1 + i),
			ISRC:      fmt.Sprintf("%s%c%c%c%02d%05d", pick(countries), alnum[r.IntN(26)], alnum[r.IntN(36)], alnum[r.IntN(36)], 10+r.IntN(16), r.IntN(100000)),
			Artist:    pick(words) + " " + pick([]string{"Collective", "Project", "& The Heat", "Sound", "Crew", ""}),
			Title:     phrase(),
			LengthSec: 90 + r.IntN(331), // 1:30 – 7:00
		}
		pool[i].Artist = strings.TrimSpace(pool[i].Artist)
	}
	// The quirks, spread over the part of the pool that the in-order walk
	// below hands out (so every quirk is in some mix, in different mixes
	// when there are several).
	quirks := []ISRCQuirk{QuirkLowercase, QuirkHyphenated, QuirkTrailingSpace, QuirkShared, QuirkShared, QuirkEmpty}
	used := min(len(pool), slots)
	for q, kind := range quirks {
		t := &pool[(q*used)/len(quirks)]
		t.Quirk = kind
		switch kind {
		case QuirkLowercase:
			t.ISRC = strings.ToLower(t.ISRC)
		case QuirkHyphenated:
			t.ISRC = t.ISRC[:2] + "-" + t.ISRC[2:5] + "-" + t.ISRC[5:7] + "-" + t.ISRC[7:]
		case QuirkTrailingSpace:
			t.ISRC += " "
		case QuirkEmpty:
			t.ISRC = ""
		}
	}
	var shared []*Track
	for i := range pool {
		if pool[i].Quirk == QuirkShared {
			shared = append(shared, &pool[i])
		}
	}
	shared[1].ISRC = shared[0].ISRC
	for i := range pool {
		c.trackByID[pool[i].ID] = &pool[i]
	}

	// Fill mixes: first walk the pool in order (every track, so every quirk,
	// is used), then pick at random without repeats inside a mix.
	cursor := 0
	mixTracks := make([][]Track, nMixes)
	for i, n := range counts {
		seen := map[int64]bool{}
		for len(mixTracks[i]) < n {
			var t Track
			if cursor < len(pool) {
				t = pool[cursor]
				cursor++
			} else {
				t = pool[r.IntN(len(pool))]
			}
			if seen[t.ID] {
				continue
			}
			seen[t.ID] = true
			mixTracks[i] = append(mixTracks[i], t)
		}
	}

	mixIdx := 0
	for p := 0; p < o.Pages; p++ {
		page := Page{
			ID:      pageIDs[p],
			Title:   pick(words) + " " + pick([]string{"Rides", "Runs", "Sessions", "Classics", "Hits", "Moves"}),
			Type:    pageTypes[p%len(pageTypes)],
			Ranking: p + 1,
		}
		var rowItems []GenreItem
		for l := 0; l < o.ListsPerPage; l++ {
			listID := listIDs[p*o.ListsPerPage+l]
			list := List{
				ID: listID, PageID: page.ID, Ranking: l + 1,
				Title:       phrase(),
				Description: "A " + strings.ToLower(pick(words)) + " list for " + pick(tagWords) + ".",
				Image:       imageSet("list", listID),
			}
			for m := 0; m < o.MixesPerList; m++ {
				mix := newMix(r, int64(mixIDBase+1+mixIdx), listID, mixTracks[mixIdx], pick, phrase)
				mixIdx++
				c.Mixes = append(c.Mixes, mix)
				list.MixIDs = append(list.MixIDs, mix.ID)
				if len(rowItems) < 8 {
					rowItems = append(rowItems, GenreItem{
						ID: mix.ID, Title: mix.Title, Description: mix.Description, BPM: mix.BPM,
						Image:          fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/image.jpg", mix.ID),
						ImageWideURL:   fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/wide.jpg", mix.ID),
						PlayerImage:    fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/player.jpg", mix.ID),
						Thumbnail:      fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/thumb.jpg", mix.ID),
						BasicImage:     fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/basic.jpg", mix.ID),
						WideImage:      fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/wide-image.jpg", mix.ID),
						SpotlightImage: fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/spotlight.jpg", mix.ID),
						Ordering:       len(rowItems) + 1,
					})
				}
			}
			list.MixCount = len(list.MixIDs)
			if (p+l)%3 == 0 {
				// The page advertises more than the list returns (broader filter).
				list.MixCount += 1 + r.IntN(5)
			}
			page.Lists = append(page.Lists, list)
		}
		for l, rank := range rankings(len(page.Lists), sr) {
			page.Lists[l].Ranking = rank
		}
		for i, ord := range rankings(len(rowItems), sr) {
			rowItems[i].Ordering = ord
		}
		c.Pages = append(c.Pages, page)
		c.Genres[page.ID] = GenreRow{ID: page.ID, Items: rowItems}
	}
	// One list without content: the page still advertises mixes for it.
	if last := &c.Pages[len(c.Pages)-1]; len(last.Lists) > 1 || len(c.Pages) > 1 {
		l := &last.Lists[len(last.Lists)-1]
		l.MixCount = len(l.MixIDs) + 2
		l.MixIDs = nil
	}
	// One page without content, listed in the catalog; its genre row exists
	// with items: null.
	empty := Page{ID: pageIDs[o.Pages], Title: "Coming Soon", Type: "genre", Ranking: o.Pages + 1}
	c.Pages = append(c.Pages, empty)
	c.Genres[empty.ID] = GenreRow{ID: empty.ID, Items: nil}
	for p, rank := range rankings(len(c.Pages), sr) {
		c.Pages[p].Ranking = rank
	}

	for i := range c.Mixes {
		c.mixByID[c.Mixes[i].ID] = &c.Mixes[i]
	}
	for i := range c.Pages {
		c.pageByID[c.Pages[i].ID] = &c.Pages[i]
		for j := range c.Pages[i].Lists {
			c.listByID[c.Pages[i].Lists[j].ID] = &c.Pages[i].Lists[j]
		}
	}

	c.Restrictions = Restrictions{
		BlockedTypes:     []string{"explicit"},
		BlockedByCountry: map[string][]int64{"DE": {c.Pages[0].ID}},
		NoneCountries:    []string{"CN"},
	}
	return c
}

func newMix(r *rand.Rand, id, listID int64, tracks []Track, pick func([]string) string, phrase func() string) Mix {
	m := Mix{
		ID: id, ListID: listID,
		Title:          phrase(),
		Description:    "A " + strings.ToLower(pick(tagWords)) + " mix by " + pick(djNames) + ".",
		MinBPM:         100 + r.IntN(40),
		Explicit:       r.IntN(10) < 3,
		URL:            fmt.Sprintf("https://cdn.sandbox.playpipe.example/mixes/%d/mix.mp3", id),
		AndroidHLSURL:  fmt.Sprintf("https://cdn.sandbox.playpipe.example/mixes/%d/android/master.m3u8", id),
		IOSHLSURL:      fmt.Sprintf("https://cdn.sandbox.playpipe.example/mixes/%d/ios/master.m3u8", id),
		ImageLarge:     fmt.Sprintf("https://img.sandbox.playpipe.example/mix/%d/large.jpg", id),
		ImageThumbnail: fmt.Sprintf("https://img.sandbox.playpipe.example/mix/%d/thumb.jpg", id),
	}
	m.MaxBPM = m.MinBPM + 5 + r.IntN(30)
	m.BPM = (m.MinBPM + m.MaxBPM) / 2
	dj := pick(djNames)
	slug := strings.ToLower(strings.ReplaceAll(dj, " ", "-"))
	m.DJ = DJ{Name: dj,
		ImageLarge:     "https://img.sandbox.playpipe.example/dj/" + slug + "/large.jpg",
		ImageThumbnail: "https://img.sandbox.playpipe.example/dj/" + slug + "/thumb.jpg"}
	start := 0
	for _, t := range tracks {
		t.StartSec = start
		t.Time = hms(start)
		start += t.LengthSec
		m.Tracks = append(m.Tracks, t)
	}
	m.LengthSec = start
	for n := 1 + r.IntN(3); len(m.Genres) < n; {
		g := r.IntN(len(genreNames))
		if !slices.ContainsFunc(m.Genres, func(x Genre) bool { return x.ID == int64(g+1) }) {
			m.Genres = append(m.Genres, Genre{ID: int64(g + 1), Title: genreNames[g], Description: genreNames[g] + " for workouts"})
		}
	}
	m.Tags = []string{pick(tagWords)}
	if t := pick(tagWords); t != m.Tags[0] {
		m.Tags = append(m.Tags, t)
	}
	return m
}

func imageSet(kind string, id int64) ImageSet {
	b := fmt.Sprintf("https://img.sandbox.playpipe.example/%s/%d/", kind, id)
	return ImageSet{Thumbnail: b + "thumb.jpg", Large: b + "large.jpg", Player: b + "player.jpg"}
}

// strictRand is the strict mode's random stream for one purpose (salt):
// deterministic from the seed, apart from the content's stream.
func strictRand(seed int64, salt uint64) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed)^0x5354524943540000, salt)) //nolint:gosec // deterministic fixtures, not security
}

// idSeq returns n ids from base+1: contiguous when r is nil (lenient), else
// with gaps of 2–10 between neighbours (strict).
func idSeq(base int64, n int, r *rand.Rand) []int64 {
	ids := make([]int64, n)
	next := base + 1
	for i := range ids {
		ids[i] = next
		if r == nil {
			next++
		} else {
			next += int64(2 + r.IntN(9))
		}
	}
	return ids
}

// rankings returns the display ranks of n items given in id order: 1…n when
// r is nil (lenient); else distinct values with gaps, assigned in an order
// that is not the id order (n ≥ 2), so that neither the ids nor the rank
// values as indexes give the display order.
func rankings(n int, r *rand.Rand) []int {
	out := make([]int, n)
	if r == nil {
		for i := range out {
			out[i] = i + 1
		}
		return out
	}
	v := 1 + r.IntN(3)
	for i := range out {
		out[i] = v
		v += 2 + r.IntN(6)
	}
	r.Shuffle(n, func(i, j int) { out[i], out[j] = out[j], out[i] })
	if n >= 2 && slices.IsSorted(out) {
		out[0], out[1] = out[1], out[0]
	}
	return out
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
