/* runtime/rt_corpus.c -- grammar and word lists of the built-in corpus; see rt_corpus.h.
 *
 * Each sentence is built in a small buffer by the functions below (one per grammar
 * rule, named after it), then capitalised and appended; the stream stops at exactly
 * n bytes. Choices come from a splitmix64 generator seeded once, so output is a
 * pure function of the seed and earlier output never depends on n. */
#include "runtime/rt_corpus.h"

#include <string.h>

/* ---- word lists (hand-written) ---- */

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *const names[] = {
  "Anna", "Tom", "Maria", "Ben", "Clara", "David", "Elena", "Felix", "Grace", "Hugo",
  "Iris", "Jonas", "Karen", "Leo", "Mina", "Noah", "Olga", "Paul", "Rosa", "Sam",
  "Tara", "Victor", "Wendy", "Yusuf", "Zoe", "Omar", "Lucy", "Peter",
};

typedef struct { const char *sg, *pl; } Noun;
static const Noun things[] = {
  {"apple", "apples"}, {"basket", "baskets"}, {"book", "books"}, {"bottle", "bottles"},
  {"box", "boxes"}, {"bread", "loaves"}, {"bridge", "bridges"}, {"brush", "brushes"},
  {"candle", "candles"}, {"chair", "chairs"}, {"clock", "clocks"}, {"coat", "coats"},
  {"cup", "cups"}, {"door", "doors"}, {"egg", "eggs"}, {"fish", "fish"},
  {"flower", "flowers"}, {"glass", "glasses"}, {"hammer", "hammers"}, {"hat", "hats"},
  {"key", "keys"}, {"knife", "knives"}, {"lamp", "lamps"}, {"leaf", "leaves"},
  {"letter", "letters"}, {"map", "maps"}, {"mirror", "mirrors"}, {"nail", "nails"},
  {"orange", "oranges"}, {"pencil", "pencils"}, {"picture", "pictures"}, {"plate", "plates"},
  {"potato", "potatoes"}, {"ribbon", "ribbons"}, {"ring", "rings"}, {"rope", "ropes"},
  {"shoe", "shoes"}, {"spoon", "spoons"}, {"stone", "stones"}, {"table", "tables"},
  {"ticket", "tickets"}, {"towel", "towels"}, {"umbrella", "umbrellas"}, {"wheel", "wheels"},
  {"window", "windows"}, {"blanket", "blankets"}, {"bucket", "buckets"}, {"drum", "drums"},
  {"feather", "feathers"}, {"jar", "jars"}, {"kettle", "kettles"}, {"ladder", "ladders"},
  {"needle", "needles"}, {"onion", "onions"}, {"pillow", "pillows"}, {"shell", "shells"},
};
static const Noun beings[] = {
  {"baker", "bakers"}, {"bird", "birds"}, {"boy", "boys"}, {"cat", "cats"},
  {"child", "children"}, {"cook", "cooks"}, {"doctor", "doctors"}, {"dog", "dogs"},
  {"farmer", "farmers"}, {"fisherman", "fishermen"}, {"fox", "foxes"}, {"girl", "girls"},
  {"goat", "goats"}, {"horse", "horses"}, {"king", "kings"}, {"man", "men"},
  {"mouse", "mice"}, {"neighbour", "neighbours"}, {"owl", "owls"}, {"painter", "painters"},
  {"queen", "queens"}, {"sailor", "sailors"}, {"soldier", "soldiers"}, {"student", "students"},
  {"teacher", "teachers"}, {"traveller", "travellers"}, {"woman", "women"}, {"wolf", "wolves"},
  {"uncle", "uncles"}, {"aunt", "aunts"}, {"old man", "old men"}, {"shepherd", "shepherds"},
};
static const char *const places[] = {
  "market", "river", "forest", "village", "kitchen", "garden", "harbour", "station",
  "library", "bakery", "school", "hill", "field", "bridge", "castle", "lake", "road",
  "farm", "square", "shop", "mill", "beach", "church", "cellar", "tower", "valley",
};
static const char *const adjectives[] = {
  "old", "young", "small", "big", "tall", "short", "red", "blue", "green", "yellow",
  "white", "black", "brown", "quiet", "loud", "happy", "sad", "tired", "hungry", "clever",
  "brave", "kind", "strange", "heavy", "light", "warm", "cold", "wet", "dry", "new",
  "broken", "shiny", "dusty", "empty", "full", "round", "sharp", "soft", "bright", "dark",
  "gentle", "proud", "careful", "lazy", "busy", "famous", "little", "wooden", "golden",
  "angry", "early", "humble", "ugly", "open", "ordinary", "important", "odd",
};
static const char *const feelings[] = {
  "happy", "sad", "tired", "hungry", "angry", "afraid", "proud", "calm", "worried",
  "surprised", "cold", "warm", "busy", "ready", "sure", "lucky", "sleepy", "quiet",
};

typedef struct { const char *base, *third, *past; } Verb;
static const Verb verbs_tr[] = {   /* take a thing as object */
  {"carry", "carries", "carried"}, {"find", "finds", "found"}, {"lose", "loses", "lost"},
  {"buy", "buys", "bought"}, {"sell", "sells", "sold"}, {"bring", "brings", "brought"},
  {"take", "takes", "took"}, {"hold", "holds", "held"}, {"open", "opens", "opened"},
  {"close", "closes", "closed"}, {"clean", "cleans", "cleaned"}, {"paint", "paints", "painted"},
  {"drop", "drops", "dropped"}, {"mend", "mends", "mended"}, {"wash", "washes", "washed"},
  {"hide", "hides", "hid"}, {"throw", "throws", "threw"}, {"keep", "keeps", "kept"},
  {"count", "counts", "counted"}, {"break", "breaks", "broke"}, {"make", "makes", "made"},
  {"fetch", "fetches", "fetched"}, {"push", "pushes", "pushed"}, {"pull", "pulls", "pulled"},
  {"fill", "fills", "filled"}, {"want", "wants", "wanted"}, {"need", "needs", "needed"},
  {"borrow", "borrows", "borrowed"}, {"give away", "gives away", "gave away"},
  {"pick up", "picks up", "picked up"}, {"look for", "looks for", "looked for"},
  {"steal", "steals", "stole"}, {"draw", "draws", "drew"}, {"cut", "cuts", "cut"},
  {"choose", "chooses", "chose"}, {"show", "shows", "showed"}, {"sort", "sorts", "sorted"},
};
static const Verb verbs_see[] = {  /* take a being as object */
  {"see", "sees", "saw"}, {"meet", "meets", "met"}, {"help", "helps", "helped"},
  {"call", "calls", "called"}, {"follow", "follows", "followed"}, {"greet", "greets", "greeted"},
  {"watch", "watches", "watched"}, {"thank", "thanks", "thanked"}, {"visit", "visits", "visited"},
  {"wake", "wakes", "woke"}, {"teach", "teaches", "taught"}, {"chase", "chases", "chased"},
  {"hear", "hears", "heard"}, {"know", "knows", "knew"}, {"trust", "trusts", "trusted"},
};
static const Verb verbs_in[] = {   /* no object */
  {"walk", "walks", "walked"}, {"run", "runs", "ran"}, {"sleep", "sleeps", "slept"},
  {"sing", "sings", "sang"}, {"wait", "waits", "waited"}, {"work", "works", "worked"},
  {"sit", "sits", "sat"}, {"stand", "stands", "stood"}, {"laugh", "laughs", "laughed"},
  {"cry", "cries", "cried"}, {"dance", "dances", "danced"}, {"swim", "swims", "swam"},
  {"rest", "rests", "rested"}, {"play", "plays", "played"}, {"listen", "listens", "listened"},
  {"travel", "travels", "travelled"}, {"hurry", "hurries", "hurried"},
  {"arrive", "arrives", "arrived"}, {"stay", "stays", "stayed"}, {"climb", "climbs", "climbed"},
  {"fall asleep", "falls asleep", "fell asleep"},
  {"go", "goes", "went"}, {"come back", "comes back", "came back"}, {"read", "reads", "read"},
  {"eat", "eats", "ate"}, {"write", "writes", "wrote"}, {"think", "thinks", "thought"},
};
static const Verb give = {"give", "gives", "gave"};
static const Verb need = {"need", "needs", "needed"};
static const char *const adverbs[] = {
  "slowly", "quickly", "quietly", "loudly", "carefully", "happily", "sadly", "suddenly",
  "again", "together", "alone", "early", "late", "softly", "gladly", "badly", "well",
  "at once", "for a while", "all day", "without a word", "once more", "in silence",
};
static const char *const preps[] = {
  "near", "behind", "beside", "under", "above", "inside", "outside", "across", "along",
  "towards", "through", "past", "around", "into", "out of", "beyond", "by", "to",
};
static const char *const times[] = {
  "in the morning", "at night", "after dinner", "before breakfast", "on Monday",
  "on Tuesday", "on Wednesday", "on Thursday", "on Friday", "on Saturday", "on Sunday",
  "in the spring", "in the summer", "in the autumn", "in the winter", "at noon",
  "every evening", "the next day", "long ago", "last year", "that afternoon",
  "at midnight", "in the rain", "one cold morning",
};
static const char *const said[] = {
  "said", "whispered", "shouted", "replied", "answered", "called", "cried",
  "muttered", "added",
};
static const char *const numbers[] = {
  "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "twelve",
  "twenty", "a hundred",
};
static const char *const subord[] = {"When", "Because", "After", "Before", "While",
                                     "Although", "Since", "As soon as"};
static const char *const conjunctions[] = {"and", "but", "so", "and then", "yet"};

/* ---- generator state ---- */

typedef struct {
  uint64_t s;
  char buf[1024];   /* sentence being built */
  size_t len;
} Gen;

static uint64_t next(Gen *g) {
  uint64_t z = (g->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static int pick(Gen *g, int n) { return (int)(next(g) % (uint64_t)n); }
static int chance(Gen *g, int percent) { return pick(g, 100) < percent; }
#define ANY(g, a) ((a)[pick(g, COUNT(a))])

static void put(Gen *g, const char *s) {
  size_t n = strlen(s);
  if (g->len + n >= sizeof g->buf) n = sizeof g->buf - 1 - g->len;
  memcpy(g->buf + g->len, s, n);
  g->len += n;
  g->buf[g->len] = '\0';
}
static void word(Gen *g, const char *s) {   /* space-separated */
  if (g->len && g->buf[g->len - 1] != ' ' && g->buf[g->len - 1] != '"') put(g, " ");
  put(g, s);
}

/* ---- grammar rules ---- */

typedef struct { int plural, person; } Agr;   /* person 1, 2 or 3 */

static void utoa(char *dst, unsigned v) {
  char rev[12];
  int k = 0;
  do rev[k++] = (char)('0' + v % 10), v /= 10; while (v);
  while (k) *dst++ = rev[--k];
  *dst = '\0';
}

static int vowel(const char *s) { return strchr("aeiou", s[0]) != NULL; }

/* np_noun: det [adj] noun, agreeing in number; a/an chosen by the word after it. */
static void np_noun(Gen *g, const Noun *n, int plural) {
  const char *adj = chance(g, 40) ? ANY(g, adjectives) : NULL;
  const char *head = plural ? n->pl : n->sg;
  const char *next_word = adj ? adj : head;
  if (plural) {
    static const char *const det[] = {"the", "the", "some", "these", "those", "his", "her",
                                      "our", "their", "many", "my"};
    if (chance(g, 15)) word(g, ANY(g, numbers));
    else word(g, ANY(g, det));
  } else {
    int d = pick(g, 10);
    if (d < 4) word(g, "the");
    else if (d < 7) word(g, vowel(next_word) ? "an" : "a");
    else {
      static const char *const det[] = {"this", "that", "his", "her", "my", "your", "every"};
      word(g, ANY(g, det));
    }
  }
  if (adj) word(g, adj);
  word(g, head);
}

static void np_thing(Gen *g) { np_noun(g, &ANY(g, things), chance(g, 35)); }

static void np_being(Gen *g) {
  if (chance(g, 40)) word(g, ANY(g, names));
  else np_noun(g, &ANY(g, beings), chance(g, 30));
}

/* subject: name | pronoun | being phrase; returns its agreement. */
static Agr subject(Gen *g) {
  int r = pick(g, 100);
  if (r < 30) {
    word(g, ANY(g, names));
    return (Agr){0, 3};
  }
  if (r < 50) {
    static const char *const pro[] = {"I", "you", "he", "she", "we", "they"};
    static const Agr agr[] = {{0, 1}, {1, 2}, {0, 3}, {0, 3}, {1, 1}, {1, 3}};
    int i = pick(g, COUNT(pro));
    word(g, pro[i]);
    return agr[i];
  }
  int plural = chance(g, 35);
  np_noun(g, &ANY(g, beings), plural);
  return (Agr){plural, 3};
}

static const char *present(const Verb *v, Agr a) {
  return (!a.plural && a.person == 3) ? v->third : v->base;
}
static const char *be_present(Agr a) {
  if (a.person == 1 && !a.plural) return "am";
  return (a.plural || a.person == 2) ? "are" : "is";
}
static const char *be_past(Agr a) {
  return (a.plural || a.person == 2) ? "were" : "was";
}

static void place(Gen *g) {
  word(g, ANY(g, preps));
  word(g, "the");
  if (chance(g, 25)) word(g, ANY(g, adjectives));
  word(g, ANY(g, places));
}

/* clause: one of the clause shapes, past or present tense. */
static void clause(Gen *g, int past) {
  Agr a = subject(g);
  int shape = pick(g, 5);
  if (shape == 0) {                       /* transitive, thing object */
    const Verb *v = &ANY(g, verbs_tr);
    word(g, past ? v->past : present(v, a));
    np_thing(g);
    if (chance(g, 40)) place(g);
  } else if (shape == 1) {                /* transitive, being object */
    const Verb *v = &ANY(g, verbs_see);
    word(g, past ? v->past : present(v, a));
    np_being(g);
    if (chance(g, 30)) word(g, ANY(g, times));
  } else if (shape == 2) {                /* intransitive */
    const Verb *v = &ANY(g, verbs_in);
    word(g, past ? v->past : present(v, a));
    if (chance(g, 50)) word(g, ANY(g, adverbs));
    if (chance(g, 50)) place(g);
  } else if (shape == 3) {                /* copula */
    word(g, past ? be_past(a) : be_present(a));
    if (chance(g, 20)) word(g, "very");
    word(g, ANY(g, feelings));
  } else {                                /* give: subject gave X to Y */
    word(g, past ? give.past : present(&give, a));
    np_thing(g);
    word(g, "to");
    np_being(g);
  }
}

/* Builds a subject, moves its text into s and returns its agreement, so that a
 * word agreeing with it can be written first (questions: "does the cat ..."). */
static Agr subject_text(Gen *g, char *s, size_t cap) {
  size_t at = g->len;
  Agr a = subject(g);
  const char *t = g->buf + at;
  while (*t == ' ') t++;
  size_t n = strlen(t);
  if (n >= cap) n = cap - 1;
  memcpy(s, t, n);
  s[n] = '\0';
  g->len = at;
  g->buf[at] = '\0';
  return a;
}

static void question(Gen *g) {
  int r = pick(g, 4);
  if (r == 0) {
    static const char *const wh[] = {"Where", "Why", "When", "How"};
    word(g, ANY(g, wh));
    word(g, "did");
    subject(g);
    const Verb *v = &ANY(g, verbs_tr);
    word(g, v->base);
    np_thing(g);
  } else if (r == 1) {
    word(g, "Where");
    int plural = chance(g, 35);
    word(g, plural ? "are" : "is");
    np_noun(g, &ANY(g, things), plural);
  } else if (r == 2) {
    char subj[256];
    Agr a = subject_text(g, subj, sizeof subj);
    word(g, (!a.plural && a.person == 3) ? "does" : "do");
    word(g, subj);
    word(g, ANY(g, verbs_in).base);
    if (chance(g, 50)) place(g);
  } else {
    word(g, "Have you seen");
    np_being(g);
  }
  put(g, "?");
}

/* sentence: the top rule; ends with its own punctuation. */
static void sentence(Gen *g, int past) {
  int r = pick(g, 100);
  if (r < 30) {
    clause(g, past);
    if (chance(g, 20)) word(g, ANY(g, times));
    put(g, ".");
  } else if (r < 45) {
    clause(g, past);
    put(g, ",");
    word(g, ANY(g, conjunctions));
    clause(g, past);
    put(g, ".");
  } else if (r < 58) {
    word(g, ANY(g, subord));
    clause(g, past);
    put(g, ",");
    clause(g, past);
    put(g, ".");
  } else if (r < 66) {
    question(g);
  } else if (r < 82) {                    /* dialogue */
    put(g, "\"");
    size_t open = g->len;
    int q = chance(g, 35);
    if (q) {
      question(g);
    } else {
      clause(g, chance(g, 50));
      put(g, ",");
    }
    if (g->buf[open] >= 'a' && g->buf[open] <= 'z') g->buf[open] = (char)(g->buf[open] - 32);
    put(g, "\" ");
    if (chance(g, 50)) {
      word(g, q ? "asked" : ANY(g, said));
      word(g, ANY(g, names));
    } else {
      word(g, ANY(g, names));
      word(g, q ? "asked" : ANY(g, said));
    }
    put(g, ".");
  } else if (r < 90) {                    /* list */
    Agr a = subject(g);
    word(g, past ? need.past : present(&need, a));
    np_thing(g);
    put(g, ",");
    np_thing(g);
    word(g, "and");
    np_thing(g);
    put(g, ".");
  } else if (r < 95) {                    /* numbers in digits */
    char num[16], year[16];
    utoa(num, (unsigned)(1 + pick(g, 999)));
    utoa(year, (unsigned)(1700 + pick(g, 300)));
    word(g, "In");
    word(g, year);
    put(g, ",");
    word(g, "the");
    word(g, ANY(g, places));
    word(g, "had");
    word(g, num);
    word(g, ANY(g, beings).pl);
    put(g, ".");
  } else {
    word(g, "It");
    word(g, past ? "was" : "is");
    const char *adj = ANY(g, adjectives);
    word(g, vowel(adj) ? "an" : "a");
    word(g, adj);
    word(g, "day");
    word(g, ANY(g, preps));
    word(g, "the");
    word(g, ANY(g, places));
    put(g, ".");
  }
}

typedef struct {
  uint8_t *dst;
  size_t n, pos;
} Out;

static void emit(Out *o, const char *s, size_t len) {
  if (len > o->n - o->pos) len = o->n - o->pos;
  memcpy(o->dst + o->pos, s, len);
  o->pos += len;
}

void rt_corpus_generate(uint8_t *dst, size_t n, uint64_t seed) {
  Gen g = {.s = seed};
  Out o = {dst, n, 0};
  int chapter = 1, paragraph = 0;
  while (o.pos < o.n) {
    if (paragraph % 40 == 0) {
      char head[32] = "Chapter ";
      utoa(head + strlen(head), (unsigned)chapter++);
      size_t k = strlen(head);
      memcpy(head + k, "\n\n", 2);
      k += 2;
      emit(&o, head, k);
    }
    paragraph++;
    int past = chance(&g, 70);
    int sentences = 2 + pick(&g, 6);
    for (int i = 0; i < sentences; i++) {
      g.len = 0;
      g.buf[0] = '\0';
      sentence(&g, past);
      char *first = g.buf[0] == '"' ? g.buf + 1 : g.buf;
      if (*first >= 'a' && *first <= 'z') *first = (char)(*first - 32);
      if (i) emit(&o, " ", 1);
      emit(&o, g.buf, g.len);
    }
    emit(&o, "\n\n", 2);
  }
}
