package sandbox

import "encoding/json"

// The sandbox's own wire types: the JSON shapes of the spec, written from the
// spec's tables and never shared with the client package.

type wireCatalogs struct {
	Catalogs []wireCatalogEntry `json:"catalogs"`
}

type wireCatalogEntry struct {
	PageID    int64  `json:"page_id"`
	Title     string `json:"title"`
	Type      string `json:"type"`
	Ranking   int    `json:"ranking"`
	ListCount int    `json:"list_count"`
}

type wireImageSet struct {
	Thumbnail string `json:"thumbnail"`
	Large     string `json:"large"`
	Player    string `json:"player"`
}

type wirePageList struct {
	ListID      int64        `json:"list_id"`
	Ranking     int          `json:"ranking"`
	Title       string       `json:"title"`
	Description string       `json:"description"`
	MixCount    int          `json:"mix_count"`
	Image       wireImageSet `json:"image"`
}

type wirePage struct {
	Page struct {
		ID    int64          `json:"id"`
		Title string         `json:"title"`
		Lists []wirePageList `json:"lists"`
	} `json:"page"`
}

type wireListMixLive struct {
	ID          int64  `json:"id"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Length      string `json:"length"`
	Explicit    int    `json:"explicit"`
	BPM         int    `json:"bpm"`
	MaxBPM      int    `json:"max_bpm"`
	ListID      int64  `json:"list_id"`
}

type wireListMixStandby struct {
	ID             int64  `json:"id"`
	Title          string `json:"title"`
	Length         string `json:"length"`
	Explicit       bool   `json:"explicit"`
	MinBPM         int    `json:"min_bpm"`
	MaxBPM         int    `json:"max_bpm"`
	ImageLarge     string `json:"image_large"`
	ImageThumbnail string `json:"image_thumbnail"`
	DJ             wireDJ `json:"dj"`
}

type wireList struct {
	List struct {
		ID          int64        `json:"id"`
		Ranking     int          `json:"ranking"`
		Title       string       `json:"title"`
		Description string       `json:"description"`
		Image       wireImageSet `json:"image"`
		Mixes       any          `json:"mixes"`
	} `json:"list"`
}

type wireGenreItemLive struct {
	ID             int64  `json:"id"`
	Title          string `json:"title"`
	Description    string `json:"description"`
	BPM            int    `json:"bpm"`
	Image          string `json:"image"`
	ImageWideURL   string `json:"image_wide_url"`
	PlayerImage    string `json:"player_image"`
	Thumbnail      string `json:"thumbnail"`
	BasicImage     string `json:"basic_image"`
	WideImage      string `json:"wide_image"`
	SpotlightImage string `json:"spotlight_image"`
	Ordering       int    `json:"ordering"`
}

type wireGenreItemStandby struct {
	ID          int64  `json:"id"`
	Title       string `json:"title"`
	Description string `json:"description"`
	BPM         int    `json:"bpm"`
	Image       string `json:"image"`
	Thumbnail   string `json:"thumbnail"`
	PlayerImage string `json:"player_image"`
	Ordering    int    `json:"ordering"`
}

type wireGenres struct {
	Rows struct {
		Items any `json:"items"` // a slice, or nil for null
	} `json:"rows"`
}

type wireDJ struct {
	Name           string `json:"name"`
	ImageLarge     string `json:"image_large"`
	ImageThumbnail string `json:"image_thumbnail"`
}

type wireTrack struct {
	ID     int64  `json:"id"`
	Time   string `json:"time"`
	ISRC   string `json:"isrc"`
	Artist string `json:"artist"`
	Title  string `json:"title"`
}

type wireGenre struct {
	ID          int64  `json:"id"`
	Title       string `json:"title"`
	Description string `json:"description"`
}

type wireMix struct {
	Mix struct {
		ID             int64       `json:"id"`
		Title          string      `json:"title"`
		Description    string      `json:"description"`
		Length         string      `json:"length"`
		MinBPM         int         `json:"min_bpm"`
		MaxBPM         int         `json:"max_bpm"`
		Explicit       bool        `json:"explicit"`
		URL            string      `json:"url"`
		AndroidHLSURL  string      `json:"android_hls_url"`
		IOSHLSURL      string      `json:"ios_hls_url"`
		HLSURL         string      `json:"hls_url"`
		ImageLarge     string      `json:"image_large"`
		ImageThumbnail string      `json:"image_thumbnail"`
		DJ             wireDJ      `json:"dj"`
		Tracks         []wireTrack `json:"tracks"`
		Genres         []wireGenre `json:"genres"`
		Tags           []string    `json:"tags"`
	} `json:"mix"`
}

type wireSessionLive struct {
	Session struct {
		Token struct {
			Token string  `json:"token"`
			Error *string `json:"error"`
		} `json:"token"`
	} `json:"session"`
}

type wireSessionFlat struct {
	Session struct {
		Token string `json:"token"`
	} `json:"session"`
}

type wireSessionRequest struct {
	ClientID        *string `json:"client_id"`
	ClientSignature *string `json:"client_signature"`
	Email           *string `json:"email"`
}

// bodies are the responses encoded once at start, per mode shape.
type bodies struct {
	catalog []byte // nil when the catalog is empty
	pages   map[int64][]byte
	lists   [2]map[int64][]byte // [0] live, [1] standby
	genres  [2]map[int64][]byte
	mixes   [2]map[int64][]byte
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("sandbox: encoding a fixture: " + err.Error()) // only plain structs: cannot happen
	}
	return b
}

// Salts of the strict wire orders (wireOrder): one per collection.
const (
	saltCatalog    = 1
	saltRestricted = 2 // + a hash of the country
	saltPage       = 1 << 32
	saltGenres     = 2 << 32
)

// catalogBody encodes the catalog entries of pages in wire order.
func (c *Catalog) catalogBody(pages []Page, salt uint64) []byte {
	keys := make([]int, len(pages))
	for i, p := range pages {
		keys[i] = p.Ranking
	}
	w := wireCatalogs{Catalogs: make([]wireCatalogEntry, 0, len(pages))}
	for _, i := range c.wireOrder(keys, salt) {
		p := &pages[i]
		w.Catalogs = append(w.Catalogs, wireCatalogEntry{PageID: p.ID, Title: p.Title, Type: p.Type, Ranking: p.Ranking, ListCount: len(p.Lists)})
	}
	return mustJSON(w)
}

func encodeBodies(c *Catalog, emptyCatalog bool) *bodies {
	b := &bodies{pages: map[int64][]byte{}}
	for i := range b.lists {
		b.lists[i], b.genres[i], b.mixes[i] = map[int64][]byte{}, map[int64][]byte{}, map[int64][]byte{}
	}
	if !emptyCatalog {
		b.catalog = c.catalogBody(c.Pages, saltCatalog)
	}
	for _, p := range c.Pages {
		if len(p.Lists) > 0 {
			var w wirePage
			w.Page.ID, w.Page.Title = p.ID, p.Title
			keys := make([]int, len(p.Lists))
			for i, l := range p.Lists {
				keys[i] = l.Ranking
			}
			for _, i := range c.wireOrder(keys, saltPage+uint64(p.ID)) {
				l := &p.Lists[i]
				w.Page.Lists = append(w.Page.Lists, wirePageList{ListID: l.ID, Ranking: l.Ranking, Title: l.Title, Description: l.Description, MixCount: l.MixCount, Image: wireImageSet(l.Image)})
			}
			b.pages[p.ID] = mustJSON(w)
		}
		for _, l := range p.Lists {
			if len(l.MixIDs) == 0 {
				continue
			}
			var live, standby wireList
			for _, w := range []*wireList{&live, &standby} {
				w.List.ID, w.List.Ranking, w.List.Title, w.List.Description, w.List.Image = l.ID, l.Ranking, l.Title, l.Description, wireImageSet(l.Image)
			}
			var lm []wireListMixLive
			var sm []wireListMixStandby
			for _, id := range l.MixIDs {
				m := c.mixByID[id]
				lm = append(lm, wireListMixLive{ID: m.ID, Title: m.Title, Description: m.Description, Length: m.Length(), Explicit: b2i(m.Explicit), BPM: m.BPM, MaxBPM: m.MaxBPM, ListID: l.ID})
				d := degrade(m)
				sm = append(sm, wireListMixStandby{ID: m.ID, Title: m.Title, Length: m.Length(), Explicit: m.Explicit, MinBPM: d.MinBPM, MaxBPM: d.MaxBPM, ImageLarge: m.ImageLarge, ImageThumbnail: m.ImageThumbnail, DJ: wireDJ(m.DJ)})
			}
			live.List.Mixes, standby.List.Mixes = lm, sm
			b.lists[0][l.ID], b.lists[1][l.ID] = mustJSON(live), mustJSON(standby)
		}
	}
	for id, row := range c.Genres {
		var live, standby wireGenres
		if row.Items != nil {
			li := make([]wireGenreItemLive, 0, len(row.Items))
			si := make([]wireGenreItemStandby, 0, len(row.Items))
			keys := make([]int, len(row.Items))
			for i, it := range row.Items {
				keys[i] = it.Ordering
			}
			for _, i := range c.wireOrder(keys, saltGenres+uint64(id)) {
				it := row.Items[i]
				li = append(li, wireGenreItemLive(it))
				si = append(si, wireGenreItemStandby{ID: it.ID, Title: it.Title, Description: it.Description, BPM: it.BPM, Image: it.Image, Thumbnail: it.Thumbnail, PlayerImage: it.PlayerImage, Ordering: it.Ordering})
			}
			live.Rows.Items, standby.Rows.Items = li, si
		}
		b.genres[0][id], b.genres[1][id] = mustJSON(live), mustJSON(standby)
	}
	for i := range c.Mixes {
		m := &c.Mixes[i]
		b.mixes[0][m.ID] = mustJSON(mixWire(m))
		d := degrade(m)
		b.mixes[1][m.ID] = mustJSON(mixWire(&d))
	}
	return b
}

func mixWire(m *Mix) wireMix {
	var w wireMix
	x := &w.Mix
	x.ID, x.Title, x.Description, x.Length = m.ID, m.Title, m.Description, m.Length()
	x.MinBPM, x.MaxBPM, x.Explicit = m.MinBPM, m.MaxBPM, m.Explicit
	x.URL, x.AndroidHLSURL, x.IOSHLSURL, x.HLSURL = m.URL, m.AndroidHLSURL, m.IOSHLSURL, m.AndroidHLSURL
	x.ImageLarge, x.ImageThumbnail, x.DJ = m.ImageLarge, m.ImageThumbnail, wireDJ(m.DJ)
	x.Tracks = make([]wireTrack, 0, len(m.Tracks))
	for _, t := range m.Tracks {
		x.Tracks = append(x.Tracks, wireTrack{ID: t.ID, Time: t.Time, ISRC: t.ISRC, Artist: t.Artist, Title: t.Title})
	}
	x.Genres = make([]wireGenre, 0, len(m.Genres))
	for _, g := range m.Genres {
		x.Genres = append(x.Genres, wireGenre(g))
	}
	x.Tags = append([]string{}, m.Tags...)
	return w
}

// degrade returns the mix as the standby cache serves it (spec, Standby mode
// 4), deterministically by id: an even id loses its description; an id
// divisible by 3 has min_bpm == max_bpm; id%4 == 0 serves the MP3 URL in all
// three HLS fields, id%4 == 1 serves the Android rendition in all three.
// Mix DegradedForStandby exposes the same to tests.
func degrade(m *Mix) Mix {
	d := *m
	if d.ID%2 == 0 {
		d.Description = ""
	}
	if d.ID%3 == 0 {
		d.MaxBPM = d.MinBPM
	}
	switch d.ID % 4 {
	case 0:
		d.AndroidHLSURL, d.IOSHLSURL = d.URL, d.URL
	case 1:
		d.IOSHLSURL = d.AndroidHLSURL
	}
	return d
}

// DegradedForStandby returns the mix as GET /partners/mix serves it in
// standby (the rules are those of degrade, listed in docs/sandbox.md).
func (m *Mix) DegradedForStandby() Mix { return degrade(m) }

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
