// data/make_tiny.cpp: make_tiny, the generator of the embedded default
// dataset: short, simple English stories from a hand-written grammar, as
// byte-level tokens (ids 0..255 are bytes, 256 = EOT, vocab 257).
//
//   make_tiny OUTDIR   writes OUTDIR/tiny_train_000001.bin (~1,000,000 tokens)
//                      OUTDIR/tiny_val_000000.bin   (~50,000 tokens)
//                      OUTDIR/tokenizer.bin         (byte-level, llm.c format)
//
// Why a generated corpus: the project must train out of the box with no
// download, and a tiny byte-level model should visibly learn (loss from
// ln 257 ~ 5.5 to well under 2). A grammar of a few hundred words with
// repeated story shapes (lost and found, a new friend, counting, sharing,
// helping, a day out, learning something, rain) has that mix of easy
// structure (spelling, punctuation, names kept through a story, sums that add
// up) and real choice (which word comes next).
//
// Deterministic: a fixed seed and our own PRNG (splitmix64) with plain modulo
// draws; no std::*_distribution, whose output differs between standard
// libraries, and nothing taken from the system. At most one draw per
// expression where C++ leaves the order of evaluation open. The validation split uses a
// different seed, so its stories differ from the training ones.
//
// Every document starts with EOT, as in llm.c's GPT-2 shards. Files are
// written under a temporary name and renamed into place.
//
// Build: g++ -std=c++17 -O2 -I. data/make_tiny.cpp llmc/io/tokenizer.cpp llmc/base/fileio.cpp -o make_tiny
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/base/fileio.h"
#include "llmc/io/tokenizer.h"

namespace {

constexpr int kEot = 256;
constexpr size_t kTrainTokens = 1000000;
constexpr size_t kValTokens = 50000;
constexpr uint64_t kTrainSeed = 0x5EED0001ULL;
constexpr uint64_t kValSeed = 0x5EED0002ULL;

// splitmix64: tiny, fast, and the same stream on every platform.
class Rng {
public:
    explicit Rng(uint64_t seed) : state_(seed) {}
    uint64_t next() {
        uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        return z ^ (z >> 31);
    }
    // Uniform in [0, n); the modulo bias is ~n/2^64, irrelevant here.
    int below(int n) { return (int)(next() % (uint64_t)n); }
    int range(int lo, int hi) { return lo + below(hi - lo + 1); }  // inclusive
    bool chance(int percent) { return below(100) < percent; }
    template <class V>
    const typename V::value_type& pick(const V& v) {
        return v[(size_t)below((int)v.size())];
    }

private:
    uint64_t state_;
};

struct Pair {
    std::string one, many;  // singular and plural
};

// Every word list of the grammar. One instance lives in main() and is passed
// down, so there is no global state.
struct Lexicon {
    std::vector<std::string> boys{"Tom", "Ben", "Sam", "Max", "Leo", "Jack", "Tim", "Dan", "Finn", "Jake", "Noah", "Alex"};
    std::vector<std::string> girls{"Lily", "Mia", "Anna", "Zoe", "Emma", "Lucy", "Sara", "Kate", "Ella", "Rosa", "Amy", "Nora"};
    std::vector<std::string> pet_names{"Spot", "Fluffy", "Pip", "Coco", "Daisy", "Buddy", "Sunny", "Bo", "Lulu", "Rex", "Milo", "Bella"};
    std::vector<std::string> animals{"cat", "dog", "bird", "rabbit", "duck", "frog", "fox", "bear", "mouse", "owl", "puppy", "kitten", "pig", "turtle", "squirrel", "goat"};
    std::vector<std::string> animal_adjs{"little", "big", "small", "old", "fluffy", "happy", "sleepy", "brave", "funny", "kind", "shy", "clever", "tiny", "friendly"};
    std::vector<std::string> kid_adjs{"little", "happy", "kind", "curious", "brave", "small", "funny", "quiet", "clever", "cheerful"};
    std::vector<std::string> places{"park", "forest", "garden", "beach", "farm", "river", "hill", "town", "school", "library", "lake", "market", "zoo", "field", "playground", "woods", "village", "meadow"};
    std::vector<std::string> spots{"under the tree", "behind a big rock", "near the pond", "in the tall grass", "under a bench", "next to the flowers", "inside an old box", "by the fence", "under the bed", "behind the door", "on the table", "in the sand", "under a leaf", "near the gate", "in a hole", "behind the house"};
    std::vector<std::string> colors{"red", "blue", "green", "yellow", "pink", "orange", "purple", "white", "black", "brown", "gold", "silver"};
    std::vector<std::string> things{"ball", "kite", "book", "hat", "toy car", "doll", "boat", "drum", "cup", "box", "shell", "key", "balloon", "blanket", "bike", "sock", "crayon", "spoon", "bell", "bag", "coat", "teddy bear", "train", "robot", "map", "jar", "scarf", "shoe"};
    std::vector<std::string> high_spots{"in a tall tree", "on the roof", "on a high shelf", "on top of the fence", "on a big rock", "in the branches"};
    std::vector<Pair> foods{{"apple", "apples"}, {"cookie", "cookies"}, {"cake", "cakes"}, {"carrot", "carrots"}, {"pear", "pears"}, {"plum", "plums"}, {"orange", "oranges"}, {"berry", "berries"}, {"muffin", "muffins"}, {"sandwich", "sandwiches"}, {"banana", "bananas"}, {"egg", "eggs"}, {"candy", "candies"}, {"peach", "peaches"}};
    std::vector<Pair> countables{{"bird", "birds"}, {"duck", "ducks"}, {"star", "stars"}, {"cloud", "clouds"}, {"fish", "fish"}, {"tree", "trees"}, {"cow", "cows"}, {"sheep", "sheep"}, {"boat", "boats"}, {"frog", "frogs"}, {"bee", "bees"}, {"flower", "flowers"}, {"shell", "shells"}, {"leaf", "leaves"}, {"car", "cars"}, {"butterfly", "butterflies"}};
    std::vector<std::string> numbers{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"};
    std::vector<std::string> good_feelings{"happy", "glad", "proud", "excited", "very happy"};
    std::vector<std::string> bad_feelings{"sad", "scared", "upset", "worried", "very sad"};
    std::vector<std::string> weather{"The sun was warm.", "It was a sunny day.", "The sky was blue.", "There were big white clouds in the sky.", "The wind was cold.", "It was a windy day.", "The air was fresh and cool.", "Birds sang in the trees.", "The grass was wet with dew.", "It was a quiet morning."};
    std::vector<std::string> days{"One day", "One morning", "One afternoon", "The next day", "On a sunny day", "Later that week", "On Sunday", "After lunch"};
    std::vector<std::string> openers{"Once upon a time", "Long ago", "Once", "A long time ago", "Not long ago"};
    std::vector<std::string> activities{"ran on the grass", "climbed a tree", "picked some flowers", "sang a song", "built a tower of blocks", "drew a picture", "jumped in the puddles", "looked at the clouds", "played a game", "threw stones into the water", "rode a bike", "read a book", "danced in the sun", "played hide and seek", "made a sand castle", "fed the ducks", "watched the ants", "flew a kite", "played tag", "splashed in the water"};
    std::vector<std::string> meals{"breakfast", "lunch", "dinner"};
    std::vector<std::string> dreams{"a big red boat", "flying over the sea", "a castle made of cake", "a dragon who liked to sing", "the moon and the stars", "a talking rabbit", "a train that went to the sky", "a garden full of candy"};
    std::vector<std::string> skills{"ride a bike", "swim", "climb the big tree", "jump over the rope", "tie a shoe", "whistle", "read a long book", "fly a kite"};
    std::vector<std::string> endings{"The end.", "It was a very good day.", "It was the best day ever.", "And that is the end of the story."};
    std::vector<std::string> together_endings{"They had a very good day.", "Then they went home for dinner.", "From that day on, they were best friends.", "And they all lived happily ever after."};
    std::vector<std::string> greetings{"Hello!", "Hi there!", "Good morning!", "Hello, friend!"};
    std::vector<std::string> parents{"Mom", "Dad", "Grandma", "Grandpa"};
    std::vector<std::string> chores{"clean your room", "eat your lunch", "put on your coat", "help me with the dishes", "feed the cat", "put away your toys"};
};

std::string cap(std::string s) {
    if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = (char)(s[0] - 'a' + 'A');
    return s;
}

// "Mom" the name, "her mom" the noun.
std::string lower(std::string s) {
    if (!s.empty() && s[0] >= 'A' && s[0] <= 'Z') s[0] = (char)(s[0] - 'A' + 'a');
    return s;
}

// "a" or "an" before a word.
std::string a(const std::string& w) {
    const char c = w.empty() ? 'x' : w[0];
    const bool vowel = c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u';
    return (vowel ? "an " : "a ") + w;
}

// One character of a story, with the pronouns that keep it consistent.
struct Character {
    std::string name;   // "Lily", or "Spot"
    std::string intro;  // "a little girl named Lily", "a small dog named Spot"
    bool female = false;
    std::string he() const { return female ? "she" : "he"; }
    std::string him() const { return female ? "her" : "him"; }
    std::string his() const { return female ? "her" : "his"; }
};

Character make_kid(Rng& r, const Lexicon& L) {
    Character c;
    c.female = r.chance(50);
    c.name = c.female ? r.pick(L.girls) : r.pick(L.boys);
    c.intro = a(r.pick(L.kid_adjs)) + " " + (c.female ? "girl" : "boy") + " named " + c.name;
    return c;
}

Character make_pet(Rng& r, const Lexicon& L) {
    Character c;
    c.female = r.chance(50);
    c.name = r.pick(L.pet_names);
    const std::string& adj = r.pick(L.animal_adjs);
    const std::string& animal = r.pick(L.animals);
    c.intro = a(adj) + " " + animal + " named " + c.name;
    return c;
}

Character make_anyone(Rng& r, const Lexicon& L) { return r.chance(70) ? make_kid(r, L) : make_pet(r, L); }

// "red kite". Two draws, two statements: the operands of + are unsequenced,
// and every compiler must draw in the same order for the output to match.
std::string colored_thing(Rng& r, const Lexicon& L) {
    const std::string& color = r.pick(L.colors);
    const std::string& thing = r.pick(L.things);
    return color + " " + thing;
}

// A second character whose name differs from the first.
Character make_other(Rng& r, const Lexicon& L, const Character& first) {
    for (;;) {
        Character c = make_anyone(r, L);
        if (c.name != first.name) return c;
    }
}

// Sentences gathered into paragraphs; a story is a few short paragraphs.
class Story {
public:
    void add(const std::string& sentence) {
        if (!line_.empty()) line_ += ' ';
        line_ += sentence;
    }
    void para() {
        if (line_.empty()) return;
        text_ += line_ + '\n';
        line_.clear();
    }
    std::string finish() {
        para();
        return text_;
    }

private:
    std::string text_, line_;
};

// A line of dialogue. words ends with . ! or ?; the tag goes after or before.
std::string say(Rng& r, const std::string& who, const std::string& words) {
    const char end = words.empty() ? '.' : words.back();
    const std::string verb = (end == '?') ? "asked" : (end == '!' && r.chance(30)) ? "shouted" : "said";
    if (r.chance(65)) {
        std::string w = words;
        if (end == '.') w.back() = ',';
        return "\"" + w + "\" " + verb + " " + who + ".";
    }
    return cap(who) + " " + verb + ", \"" + words + "\"";
}

std::string opening(Rng& r, const Lexicon& L, const Character& c) {
    switch (r.below(3)) {
        case 0: return r.pick(L.openers) + ", there was " + c.intro + ".";
        case 1: return cap(c.intro) + " lived near the " + r.pick(L.places) + ".";
        default: return "This is a story about " + c.intro + ".";
    }
}

void maybe_weather(Rng& r, const Lexicon& L, Story& s) {
    if (r.chance(40)) s.add(r.pick(L.weather));
}

// The closing line. moral fits the story's shape ("" for none); together
// says whether two characters were in it, so "they" has someone to mean.
void ending(Rng& r, const Lexicon& L, Story& s, const std::string& moral, bool together) {
    s.para();
    if (!moral.empty() && r.chance(35)) s.add(moral);
    if (r.chance(60)) s.add(together && r.chance(50) ? r.pick(L.together_endings) : r.pick(L.endings));
}

std::string story_lost_and_found(Rng& r, const Lexicon& L) {
    Story s;
    Character hero = make_anyone(r, L);
    const std::string thing = colored_thing(r, L);
    const std::string place = r.pick(L.places);
    s.add(opening(r, L, hero));
    s.add(cap(hero.he()) + " had " + a(thing) + ".");
    s.add(cap(hero.he()) + " loved " + hero.his() + " " + thing + " very much.");
    s.para();
    s.add(r.pick(L.days) + ", " + hero.name + " took the " + thing + " to the " + place + ".");
    maybe_weather(r, L, s);
    s.add(cap(hero.he()) + " " + r.pick(L.activities) + ".");
    s.add("When " + hero.he() + " looked for " + hero.his() + " " + thing + ", it was gone!");
    s.add(hero.name + " was " + r.pick(L.bad_feelings) + ".");
    s.add(say(r, hero.name, "Where is my " + thing + "?"));
    s.para();
    // Distinct places to look, the last one being where the thing is.
    const int tries = r.range(1, 3);
    std::vector<std::string> looked;
    while ((int)looked.size() <= tries) {
        const std::string& spot = r.pick(L.spots);
        bool seen = false;
        for (const std::string& x : looked) seen = seen || x == spot;
        if (!seen) looked.push_back(spot);
    }
    for (int i = 0; i < tries; ++i) s.add(cap(hero.he()) + " looked " + looked[(size_t)i] + ", but it was not there.");
    const std::string& found_spot = looked.back();
    if (r.chance(50)) {
        Character helper = make_other(r, L, hero);
        s.add("Then " + helper.name + " came to help.");
        s.add(say(r, helper.name, "I will help you look."));
        s.add("Together they looked " + found_spot + ", and there it was!");
        s.add(say(r, hero.name, "Thank you, " + helper.name + "!"));
    } else {
        s.add("At last, " + hero.he() + " looked " + found_spot + ", and there it was!");
        s.add(say(r, hero.name, "I found it!"));
    }
    s.add(hero.name + " was " + r.pick(L.good_feelings) + " again.");
    ending(r, L, s, "Always keep your things safe.", false);
    return s.finish();
}

std::string story_new_friend(Rng& r, const Lexicon& L) {
    Story s;
    Character hero = make_kid(r, L);
    Character pet = make_pet(r, L);
    const std::string place = r.pick(L.places);
    s.add(opening(r, L, hero));
    s.add(r.pick(L.days) + ", " + hero.name + " went to the " + place + ".");
    maybe_weather(r, L, s);
    // The pet's intro names its kind: "a shy fox named Pip" -> "fox".
    const std::string kind = pet.intro.substr(0, pet.intro.find(" named "));
    const std::string species = kind.substr(kind.rfind(' ') + 1);
    s.add("There " + hero.he() + " saw " + kind + ".");
    s.para();
    s.add(say(r, hero.name, r.pick(L.greetings)));
    s.add(say(r, hero.name, "What is your name?"));
    s.add(say(r, "the " + species, "My name is " + pet.name + "."));
    s.add(say(r, pet.name, "Do you want to play with me?"));
    s.add(say(r, hero.name, "Yes, I do!"));
    s.para();
    s.add(hero.name + " and " + pet.name + " played all day.");
    s.add("They " + r.pick(L.activities) + ".");
    if (r.chance(50)) s.add("Then they " + r.pick(L.activities) + ".");
    if (r.chance(50)) {
        s.add("When the sun went down, " + hero.name + " had to go home.");
        s.add(say(r, hero.name, "Will you come back tomorrow?"));
        s.add(say(r, pet.name, "Yes, I will!"));
    }
    ending(r, L, s, "It is fun to make a new friend.", true);
    return s.finish();
}

std::string story_counting(Rng& r, const Lexicon& L) {
    Story s;
    Character hero = make_kid(r, L);
    const Pair& what = r.pick(L.countables);
    const std::string place = r.pick(L.places);
    const int n = r.range(2, 9);
    s.add(opening(r, L, hero));
    s.add(cap(hero.he()) + " liked to count things.");
    s.para();
    s.add(r.pick(L.days) + ", " + hero.name + " was at the " + place + ".");
    s.add(cap(hero.he()) + " saw some " + what.many + ".");
    s.add(say(r, hero.name, "Let me count them."));
    std::string counting;
    for (int i = 1; i <= n; ++i) {
        counting += (i == 1) ? cap(L.numbers[(size_t)i]) : L.numbers[(size_t)i];
        counting += (i < n) ? ", " : ".";
    }
    s.add(counting);
    s.add(say(r, hero.name, "There are " + L.numbers[(size_t)n] + " " + what.many + "!"));
    if (r.chance(60)) {
        const int more = r.range(1, 3);
        s.add("Then " + L.numbers[(size_t)more] + " more " + (more == 1 ? what.one : what.many) + " came.");
        s.add(say(r, hero.name, "Now there are " + L.numbers[(size_t)(n + more)] + " " + what.many + "."));
    } else if (n > 2) {
        const int gone = r.range(1, n - 1);
        s.add("Then " + L.numbers[(size_t)gone] + " " + (gone == 1 ? what.one + " went" : what.many + " went") +
              " away.");
        s.add(say(r, hero.name, "Now there " + std::string(n - gone == 1 ? "is " : "are ") +
                                    L.numbers[(size_t)(n - gone)] + " " + (n - gone == 1 ? what.one : what.many) +
                                    "."));
    }
    ending(r, L, s, "Counting is fun.", false);
    return s.finish();
}

std::string story_sharing(Rng& r, const Lexicon& L) {
    Story s;
    Character hero = make_kid(r, L);
    Character friend_ = make_other(r, L, hero);
    const Pair& food = r.pick(L.foods);
    const int n = r.range(3, 10);
    const int k = r.range(1, n - 1);
    s.add(opening(r, L, hero));
    s.add(cap(hero.he()) + " had " + L.numbers[(size_t)n] + " " + food.many + ".");
    s.para();
    s.add(r.pick(L.days) + ", " + hero.name + " met " + friend_.intro + ".");
    s.add(friend_.name + " was hungry.");
    s.add(say(r, friend_.name, "Can I have some " + food.many + "?"));
    s.add(say(r, hero.name, "Yes, you can."));
    s.add(hero.name + " gave " + L.numbers[(size_t)k] + " " + (k == 1 ? food.one : food.many) + " to " +
          friend_.name + ".");
    const int left = n - k;
    s.add("Now " + hero.name + " had " + L.numbers[(size_t)left] + " " + (left == 1 ? food.one : food.many) +
          " and " + friend_.name + " had " + L.numbers[(size_t)k] + ".");
    s.add("They ate the " + food.many + " together.");
    s.add(say(r, friend_.name, "Thank you, " + hero.name + ". You are a good friend."));
    ending(r, L, s, "Sharing is good.", true);
    return s.finish();
}

std::string story_helping(Rng& r, const Lexicon& L) {
    Story s;
    Character hero = make_anyone(r, L);
    Character helper = make_other(r, L, hero);
    const std::string thing = colored_thing(r, L);
    const std::string high = r.pick(L.high_spots);
    s.add(opening(r, L, hero));
    maybe_weather(r, L, s);
    s.add("One day, " + hero.his() + " " + thing + " got stuck " + high + ".");
    s.add(hero.name + " wanted to get it, but it was too high.");
    s.add(cap(hero.he()) + " jumped and jumped, but " + hero.he() + " could not reach it.");
    s.add(hero.name + " felt " + r.pick(L.bad_feelings) + ".");
    s.para();
    s.add("Then " + helper.intro + " came by.");
    s.add(say(r, helper.name, "What is wrong?"));
    s.add(say(r, hero.name, "My " + thing + " is stuck " + high + "."));
    s.add(say(r, helper.name, "I can help you."));
    switch (r.below(3)) {
        case 0: s.add(helper.name + " found a long stick and pushed the " + thing + " down."); break;
        case 1: s.add(helper.name + " brought a ladder, and they got the " + thing + " down."); break;
        default: s.add(cap(helper.name) + " stood on a box and reached up high."); break;
    }
    s.add(say(r, hero.name, "Thank you, " + helper.name + "!"));
    s.add(hero.name + " was " + r.pick(L.good_feelings) + ".");
    ending(r, L, s, "It is good to help a friend.", true);
    return s.finish();
}

std::string story_day(Rng& r, const Lexicon& L) {
    Story s;
    Character hero = make_kid(r, L);
    const Pair& food = r.pick(L.foods);
    s.add(opening(r, L, hero));
    s.para();
    s.add("In the morning, " + hero.name + " woke up and ate " + a(food.one) + " for " + L.meals[0] + ".");
    maybe_weather(r, L, s);
    const std::string& place = r.pick(L.places);
    const std::string& parent = r.pick(L.parents);
    s.add("Then " + hero.he() + " went to the " + place + " with " + hero.his() + " " + lower(parent) + ".");
    s.add("There " + hero.he() + " " + r.pick(L.activities) + ".");
    s.add("In the afternoon, " + hero.he() + " " + r.pick(L.activities) + ".");
    if (r.chance(50)) s.add(cap(hero.he()) + " also " + r.pick(L.activities) + ".");
    s.add("At night, " + hero.name + " was very tired.");
    s.add(cap(hero.he()) + " went to bed and dreamed about " + r.pick(L.dreams) + ".");
    ending(r, L, s, "", false);
    return s.finish();
}

std::string story_ask_parent(Rng& r, const Lexicon& L) {
    Story s;
    Character hero = make_kid(r, L);
    const std::string parent = r.pick(L.parents);
    const std::string place = r.pick(L.places);
    s.add(opening(r, L, hero));
    s.add(r.pick(L.days) + ", " + hero.name + " wanted to go to the " + place + ".");
    s.add(say(r, hero.name, parent + ", can we go to the " + place + "?"));
    const std::string chore = r.pick(L.chores);
    s.add(say(r, parent, "Yes, but first you must " + chore + "."));
    s.add(hero.name + " did it quickly.");
    s.add(say(r, hero.name, "I am done!"));
    s.para();
    s.add("So " + hero.name + " and " + parent + " went to the " + place + ".");
    maybe_weather(r, L, s);
    s.add(hero.name + " " + r.pick(L.activities) + ".");
    s.add(say(r, hero.name, "Thank you, " + parent + ". This is fun!"));
    ending(r, L, s, "First work, then play.", true);
    return s.finish();
}

std::string story_learning(Rng& r, const Lexicon& L) {
    Story s;
    Character hero = make_kid(r, L);
    Character teacher = make_other(r, L, hero);
    const std::string skill = r.pick(L.skills);
    s.add(opening(r, L, hero));
    s.add(hero.name + " wanted to " + skill + ", but " + hero.he() + " did not know how.");
    s.para();
    const int falls = r.range(1, 3);
    for (int i = 0; i < falls; ++i) {
        s.add(i == 0 ? cap(hero.he()) + " tried, but it did not work." : cap(hero.he()) + " tried again, but it did not work.");
    }
    s.add(hero.name + " was " + r.pick(L.bad_feelings) + ".");
    s.add(say(r, hero.name, "I can not do it."));
    s.add("Then " + teacher.intro + " came by.");
    s.add(say(r, teacher.name, "Do not give up. Try one more time."));
    s.add("So " + hero.name + " tried one more time, and this time " + hero.he() + " could " + skill + "!");
    s.add(say(r, hero.name, "I did it!"));
    s.add(hero.name + " was " + r.pick(L.good_feelings) + ".");
    ending(r, L, s, "Never give up.", false);
    return s.finish();
}

std::string story_rain(Rng& r, const Lexicon& L) {
    Story s;
    Character hero = make_anyone(r, L);
    Character friend_ = make_other(r, L, hero);
    const std::string place = r.pick(L.places);
    s.add(opening(r, L, hero));
    s.add(r.pick(L.days) + ", " + hero.name + " and " + hero.his() + " friend " + friend_.name + " went to the " +
          place + ".");
    s.add("They " + r.pick(L.activities) + ".");
    s.para();
    s.add("Then the sky became dark, and it started to rain.");
    s.add(say(r, friend_.name, "Oh no, we will get wet!"));
    if (r.chance(50)) {
        s.add("They ran home as fast as they could.");
        s.add("At home, they drank warm milk and looked at the rain.");
    } else {
        s.add("They hid " + r.pick(L.spots) + " until the rain stopped.");
        s.add("Then the sun came out, and they saw a rainbow.");
        s.add(say(r, hero.name, "Look, a rainbow!"));
    }
    ending(r, L, s, "", true);
    return s.finish();
}

std::string make_document(Rng& r, const Lexicon& L) {
    switch (r.below(9)) {
        case 0: return story_lost_and_found(r, L);
        case 1: return story_new_friend(r, L);
        case 2: return story_counting(r, L);
        case 3: return story_sharing(r, L);
        case 4: return story_helping(r, L);
        case 5: return story_day(r, L);
        case 6: return story_ask_parent(r, L);
        case 7: return story_learning(r, L);
        default: return story_rain(r, L);
    }
}

// Whole documents (EOT, then the story's bytes) until at least target tokens.
std::vector<uint16_t> make_tokens(uint64_t seed, size_t target, const Lexicon& L) {
    Rng r(seed);
    std::vector<uint16_t> tokens;
    tokens.reserve(target + 4096);
    while (tokens.size() < target) {
        tokens.push_back((uint16_t)kEot);
        for (unsigned char c : make_document(r, L)) tokens.push_back(c);
    }
    return tokens;
}

void put_le32(std::vector<unsigned char>* out, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) (*out)[at + (size_t)i] = (unsigned char)((v >> (8 * i)) & 0xff);
}

bool write_shard(const std::string& path, const std::vector<uint16_t>& tokens, std::string* err) {
    std::vector<unsigned char> data(1024 + 2 * tokens.size(), 0);
    put_le32(&data, 0, 20240520);  // uint16 shard magic
    put_le32(&data, 4, 1);         // its version
    put_le32(&data, 8, (uint32_t)tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
        data[1024 + 2 * i] = (unsigned char)(tokens[i] & 0xff);
        data[1024 + 2 * i + 1] = (unsigned char)(tokens[i] >> 8);
    }
    AtomicWriter w;  // temporary name, renamed into place on commit
    if (!w.open(path, err)) return false;
    if (!w.write(data.data(), data.size())) {
        *err = "cannot write " + path;
        return false;
    }
    return w.commit(err);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    std::string err;
    if (!make_dirs(dir, &err)) {
        std::fprintf(stderr, "make_tiny: %s\n", err.c_str());
        return 1;
    }
    const Lexicon lexicon;
    const std::vector<uint16_t> train = make_tokens(kTrainSeed, kTrainTokens, lexicon);
    const std::vector<uint16_t> val = make_tokens(kValSeed, kValTokens, lexicon);
    if (!write_shard(dir + "/tiny_train_000001.bin", train, &err) ||
        !write_shard(dir + "/tiny_val_000000.bin", val, &err) ||
        !write_byte_tokenizer(dir + "/tokenizer.bin", &err)) {
        std::fprintf(stderr, "make_tiny: %s\n", err.c_str());
        return 1;
    }
    std::printf("make_tiny: %s/tiny_train_000001.bin %zu tokens, %s/tiny_val_000000.bin %zu tokens, %s/tokenizer.bin\n",
                dir.c_str(), train.size(), dir.c_str(), val.size(), dir.c_str());
    return 0;
}
