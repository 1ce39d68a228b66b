package sandbox

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

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

// catalogGen draws one catalog's content from r; in strict mode its ids
// and rankings from a stream of their own, sr (nil in lenient mode), so that
// the content (titles, tracks, mix and track ids) is the same in both modes.
type catalogGen struct {
	o     Config
	r, sr *rand.Rand
}

func (g *catalogGen) pick(s []string) string { return s[g.r.IntN(len(s))] }

func (g *catalogGen) phrase() string { return g.pick(words) + " " + g.pick(words) }

// newCatalog generates the catalog of o.Seed. The steps draw from the
// random streams in a fixed order: changing it changes every catalog.
func newCatalog(o Config) *Catalog {
	g := &catalogGen{o: o, r: rand.New(rand.NewPCG(uint64(o.Seed), 0x706c61797069706))} //nolint:gosec // deterministic fixtures, not security
	if !o.Lenient {
		g.sr = strictRand(o.Seed, 0)
	}
	pageIDs := idSeq(pageIDBase, o.Pages+1, g.sr)
	listIDs := idSeq(listIDBase, o.Pages*o.ListsPerPage, g.sr)

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
	counts, slots := g.mixSizes(o.Pages * o.ListsPerPage * o.MixesPerList)
	pool := g.trackPool(slots)
	for i := range pool {
		c.trackByID[pool[i].ID] = &pool[i]
	}
	mixTracks := g.fillMixes(pool, counts)

	mixIdx := 0
	for p := 0; p < o.Pages; p++ {
		g.addPage(c, p, pageIDs[p], listIDs[p*o.ListsPerPage:(p+1)*o.ListsPerPage], mixTracks, &mixIdx)
	}
	g.addEmpty(c, pageIDs[o.Pages])
	c.index()
	c.Restrictions = Restrictions{
		BlockedTypes:     []string{"explicit"},
		BlockedByCountry: map[string][]int64{"DE": {c.Pages[0].ID}},
		NoneCountries:    []string{"CN"},
	}
	return c
}

// mixSizes draws the number of tracks of each of n mixes, and their sum.
func (g *catalogGen) mixSizes(n int) (counts []int, slots int) {
	counts = make([]int, n)
	for i := range counts {
		counts[i] = 8 + g.r.IntN(18) // 8–25 tracks
		slots += counts[i]
	}
	return counts, slots
}

// trackPool draws the tracks the mixes' slots are filled from, with the
// ISRC quirks.
func (g *catalogGen) trackPool(slots int) []Track {
	// A pool smaller than the slots, so that some tracks recur across mixes.
	// At least 25 tracks, so that any mix can be filled without repeats.
	pool := make([]Track, max(slots*3/4, 25))
	for i := range pool {
		pool[i] = Track{
			ID:        int64(trackIDBase + 1 + i),
			ISRC:      fmt.Sprintf("%s%c%c%c%02d%05d", g.pick(countries), alnum[g.r.IntN(26)], alnum[g.r.IntN(36)], alnum[g.r.IntN(36)], 10+g.r.IntN(16), g.r.IntN(100000)),
			Artist:    g.pick(words) + " " + g.pick([]string{"Collective", "Project", "& The Heat", "Sound", "Crew", ""}),
			Title:     g.phrase(),
			LengthSec: 90 + g.r.IntN(331), // 1:30 – 7:00
		}
		pool[i].Artist = strings.TrimSpace(pool[i].Artist)
	}
	addQuirks(pool, min(len(pool), slots))
	return pool
}

// addQuirks spreads the ISRC quirks over the first used tracks of pool, the
// part that fillMixes' in-order walk hands out (so every quirk is in some
// mix, in different mixes when there are several).
func addQuirks(pool []Track, used int) {
	quirks := []ISRCQuirk{QuirkLowercase, QuirkHyphenated, QuirkTrailingSpace, QuirkShared, QuirkShared, QuirkEmpty}
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
}

// fillMixes draws the tracks of each mix (counts[i] for mix i): first it
// walks the pool in order (every track, so every quirk, is used), then it
// picks at random without repeats inside a mix.
func (g *catalogGen) fillMixes(pool []Track, counts []int) [][]Track {
	cursor := 0
	mixTracks := make([][]Track, len(counts))
	for i, n := range counts {
		seen := map[int64]bool{}
		for len(mixTracks[i]) < n {
			var t Track
			if cursor < len(pool) {
				t = pool[cursor]
				cursor++
			} else {
				t = pool[g.r.IntN(len(pool))]
			}
			if seen[t.ID] {
				continue
			}
			seen[t.ID] = true
			mixTracks[i] = append(mixTracks[i], t)
		}
	}
	return mixTracks
}

// addPage generates page p (id pageID) with its lists (listIDs), their
// mixes (from mixTracks[*mixIdx] on) and its genre row, and adds them to c.
func (g *catalogGen) addPage(c *Catalog, p int, pageID int64, listIDs []int64, mixTracks [][]Track, mixIdx *int) {
	page := Page{
		ID:      pageID,
		Title:   g.pick(words) + " " + g.pick([]string{"Rides", "Runs", "Sessions", "Classics", "Hits", "Moves"}),
		Type:    pageTypes[p%len(pageTypes)],
		Ranking: p + 1,
	}
	var rowItems []GenreItem
	for l, listID := range listIDs {
		list := List{
			ID: listID, PageID: page.ID, Ranking: l + 1,
			Title:       g.phrase(),
			Description: "A " + strings.ToLower(g.pick(words)) + " list for " + g.pick(tagWords) + ".",
			Image:       imageSet("list", listID),
		}
		for m := 0; m < g.o.MixesPerList; m++ {
			mix := newMix(g.r, int64(mixIDBase+1+*mixIdx), listID, mixTracks[*mixIdx], g.pick, g.phrase)
			*mixIdx++
			c.Mixes = append(c.Mixes, mix)
			list.MixIDs = append(list.MixIDs, mix.ID)
			if len(rowItems) < 8 {
				rowItems = append(rowItems, genreItem(mix, len(rowItems)+1))
			}
		}
		list.MixCount = len(list.MixIDs)
		if (p+l)%3 == 0 {
			// The page advertises more than the list returns (broader filter).
			list.MixCount += 1 + g.r.IntN(5)
		}
		page.Lists = append(page.Lists, list)
	}
	for l, rank := range rankings(len(page.Lists), g.sr) {
		page.Lists[l].Ranking = rank
	}
	for i, ord := range rankings(len(rowItems), g.sr) {
		rowItems[i].Ordering = ord
	}
	c.Pages = append(c.Pages, page)
	c.Genres[page.ID] = GenreRow{ID: page.ID, Items: rowItems}
}

// genreItem is the genre row's item of mix at ordering.
func genreItem(mix Mix, ordering int) GenreItem {
	return GenreItem{
		ID: mix.ID, Title: mix.Title, Description: mix.Description, BPM: mix.BPM,
		Image:          fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/image.jpg", mix.ID),
		ImageWideURL:   fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/wide.jpg", mix.ID),
		PlayerImage:    fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/player.jpg", mix.ID),
		Thumbnail:      fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/thumb.jpg", mix.ID),
		BasicImage:     fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/basic.jpg", mix.ID),
		WideImage:      fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/wide-image.jpg", mix.ID),
		SpotlightImage: fmt.Sprintf("https://img.sandbox.playpipe.example/row/%d/spotlight.jpg", mix.ID),
		Ordering:       ordering,
	}
}

// addEmpty adds the content-less fixtures: one list without content (the
// page still advertises mixes for it) and one page without content (id
// emptyID), listed in the catalog, whose genre row exists with items: null;
// then it ranks the pages.
func (g *catalogGen) addEmpty(c *Catalog, emptyID int64) {
	if last := &c.Pages[len(c.Pages)-1]; len(last.Lists) > 1 || len(c.Pages) > 1 {
		l := &last.Lists[len(last.Lists)-1]
		l.MixCount = len(l.MixIDs) + 2
		l.MixIDs = nil
	}
	empty := Page{ID: emptyID, Title: "Coming Soon", Type: "genre", Ranking: g.o.Pages + 1}
	c.Pages = append(c.Pages, empty)
	c.Genres[empty.ID] = GenreRow{ID: empty.ID, Items: nil}
	for p, rank := range rankings(len(c.Pages), g.sr) {
		c.Pages[p].Ranking = rank
	}
}

// index fills c's lookup maps by id (of mixes, pages and lists).
func (c *Catalog) index() {
	for i := range c.Mixes {
		c.mixByID[c.Mixes[i].ID] = &c.Mixes[i]
	}
	for i := range c.Pages {
		c.pageByID[c.Pages[i].ID] = &c.Pages[i]
		for j := range c.Pages[i].Lists {
			c.listByID[c.Pages[i].Lists[j].ID] = &c.Pages[i].Lists[j]
		}
	}
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
