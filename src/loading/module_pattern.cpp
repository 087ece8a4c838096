#include "loading/module_pattern.h"

#include <algorithm>
#include <cctype>
#include <functional>

#include "loading/json_excerpt.h"
#include "model/error.h"

namespace markbase {

namespace {

using Node = ModulePattern::Node;
using Branch = std::vector<Node>;

constexpr size_t kMaxPatternBytes = 1000;
constexpr int kMaxDepth = 32;
constexpr int kMaxRepeat = 1000;
constexpr int64_t kMaxSteps = 1'000'000;  // ~40 ms: a real pattern takes a few thousand on a module name
// Repetitions in progress at once (each holds a few stack frames): a real match needs about one per byte of
// the name; "((){1000}){1000}" would need a million and overflow the stack first.
constexpr int kMaxNesting = 2000;

std::bitset<256> class_of(char c) {
    std::bitset<256> s;
    for (int b = 0; b < 256; ++b) {
        const bool in = c == 'd' || c == 'D'   ? std::isdigit(b) != 0
                        : c == 'w' || c == 'W' ? std::isalnum(b) != 0 || b == '_'
                                               : std::isspace(b) != 0;
        s[b] = in;
    }
    return std::isupper(static_cast<unsigned char>(c)) ? ~s : s;
}

class Parser {
  public:
    Parser(const std::string& p, const std::string& where) : p_(p), where_(where) {}

    std::vector<Branch> parse() {
        std::vector<Branch> out = alternatives(0);
        if (i_ < p_.size()) fail("has a ')' without its '('");
        return out;
    }

  private:
    [[noreturn]] void fail(const std::string& what) const {
        throw Error(where_ + " " + what + " (at offset " + std::to_string(i_) +
                    " of the regular expression '" + text_excerpt(p_) + "')");
    }
    bool at(char c) const { return i_ < p_.size() && p_[i_] == c; }

    std::vector<Branch> alternatives(int depth) {
        if (depth > kMaxDepth) fail("nests groups more than " + std::to_string(kMaxDepth) + " deep");
        std::vector<Branch> out(1);
        while (i_ < p_.size() && p_[i_] != ')') {
            if (p_[i_] == '|') {
                ++i_;
                out.emplace_back();
                continue;
            }
            Node n = atom(depth);
            quantifier(n);
            out.back().push_back(std::move(n));
        }
        return out;
    }

    Node atom(int depth) {
        Node n;
        const char c = p_[i_++];
        switch (c) {
            case '(':
                if (p_.compare(i_, 2, "?:") == 0)
                    i_ += 2;
                else if (at('?'))
                    fail("uses a '(?' construct other than '(?:', which is not supported");
                n.kind = Node::Kind::kGroup;
                n.branches = alternatives(depth + 1);
                if (!at(')')) fail("has a '(' without its ')'");
                ++i_;
                return n;
            case '[':
                n.set = char_class();
                return n;
            case '.':
                n.set.set();
                n.set.reset('\n');
                return n;
            case '^':
                n.kind = Node::Kind::kBegin;
                return n;
            case '$':
                n.kind = Node::Kind::kEnd;
                return n;
            case '\\':
                return escape();
            case '*':
            case '+':
            case '?':
                --i_;
                fail("has a quantifier with nothing to repeat");
            default:  // '{' and '}' that are not a quantifier are literal, as Python reads them
                n.set.set(static_cast<unsigned char>(c));
                return n;
        }
    }

    // After a '\\', outside a class.
    Node escape() {
        if (i_ >= p_.size()) fail("ends with a lone '\\'");
        Node n;
        const char c = p_[i_++];
        if (c == 'A') {
            n.kind = Node::Kind::kBegin;
        } else if (c == 'Z') {
            n.kind = Node::Kind::kEnd;
        } else {
            n.set = class_escape(c);
        }
        return n;
    }

    // The bytes an escape stands for (\d \w \s and negations, \n \t, escaped punctuation).
    std::bitset<256> class_escape(char c) {
        std::bitset<256> s;
        if (std::string("dDwWsS").find(c) != std::string::npos) return class_of(c);
        if (c == 'n' || c == 't') {
            s.set(c == 'n' ? '\n' : '\t');
        } else if (std::isalnum(static_cast<unsigned char>(c))) {
            --i_;
            fail(std::string("uses the escape '\\") + c + "', which is not supported");
        } else {
            s.set(static_cast<unsigned char>(c));
        }
        return s;
    }

    std::bitset<256> char_class() {
        std::bitset<256> s;
        const bool negate = at('^');
        if (negate) ++i_;
        bool first = true;
        while (i_ < p_.size() && (p_[i_] != ']' || first)) {
            first = false;
            const char c = p_[i_++];
            if (c == '\\') {
                if (i_ >= p_.size()) break;
                s |= class_escape(p_[i_++]);
                continue;
            }
            if (at('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
                const unsigned char hi = static_cast<unsigned char>(p_[i_ + 1]);
                if (hi < static_cast<unsigned char>(c)) fail("has a class range that runs backwards");
                for (int b = static_cast<unsigned char>(c); b <= hi; ++b) s.set(b);
                i_ += 2;
                continue;
            }
            s.set(static_cast<unsigned char>(c));
        }
        if (!at(']')) fail("has a '[' without its ']'");
        ++i_;
        return negate ? ~s : s;
    }

    // {m}, {m,}, {,n}, {m,n}: sets n's counts and returns true; false where the braces are no quantifier
    // (then '{' is a literal, as Python reads it).
    bool braces(Node& n) {
        size_t j = i_ + 1;
        auto number = [&](int& v) {
            const size_t start = j;
            v = 0;
            while (j < p_.size() && std::isdigit(static_cast<unsigned char>(p_[j])))
                v = std::min(v * 10 + (p_[j++] - '0'), kMaxRepeat + 1);
            return j > start;
        };
        int lo = 0, hi = 0;
        const bool has_lo = number(lo);
        hi = lo;
        if (j < p_.size() && p_[j] == ',') {
            ++j;
            if (!number(hi)) {
                if (!has_lo) return false;  // "{,}"
                hi = -1;
            }
        } else if (!has_lo) {
            return false;
        }
        if (j >= p_.size() || p_[j] != '}') return false;
        if (lo > kMaxRepeat || hi > kMaxRepeat)
            fail("repeats more than " + std::to_string(kMaxRepeat) + " times");
        if (hi >= 0 && hi < lo) fail("has a repetition {m,n} with n < m");
        n.min = lo;
        n.max = hi;
        i_ = j + 1;
        return true;
    }

    void quantifier(Node& n) {
        if (at('*')) {
            n.min = 0, n.max = -1, ++i_;
        } else if (at('+')) {
            n.min = 1, n.max = -1, ++i_;
        } else if (at('?')) {
            n.min = 0, n.max = 1, ++i_;
        } else if (!at('{') || !braces(n)) {
            return;
        }
        if (at('?')) ++i_;  // lazy: the same yes/no answer for a match at the start
        if (at('*') || at('+') || at('?')) fail("repeats a repetition (Python refuses it too)");
    }

    const std::string& p_;
    const std::string& where_;
    size_t i_ = 0;
};

using Cont = std::function<bool(size_t)>;

// Backtracking with continuations: each node's matcher calls k with every position it can end at.
struct Matcher {
    const std::string& s;
    const std::string& where;
    const std::string& pattern;
    int64_t steps = 0;
    int nesting = 0;

    [[noreturn]] void too_much(const std::string& what) const {
        throw Error(where + " takes too much work to match (the regular expression '" +
                    text_excerpt(pattern) + "' " + what + " on a module name)");
    }
    bool seq(const Branch& b, size_t i, size_t pos, const Cont& k) {
        if (i == b.size()) return k(pos);
        return rep(b[i], 0, pos, [&](size_t p) { return seq(b, i + 1, p, k); });
    }
    // Greedy: one more repetition first, then stop; a repetition that matched nothing ends the loop.
    bool rep(const Node& n, int count, size_t pos, const Cont& k) {
        if (++steps > kMaxSteps) too_much("backtracks past " + std::to_string(kMaxSteps) + " steps");
        if (nesting >= kMaxNesting)
            too_much("nests more than " + std::to_string(kMaxNesting) + " repetitions");
        struct Nest {
            int& depth;
            ~Nest() { --depth; }
        } nest{++nesting};
        if (n.max < 0 || count < n.max) {
            const Cont more = [&](size_t p) {
                return p == pos && count >= n.min ? false : rep(n, count + 1, p, k);
            };
            if (one(n, pos, more)) return true;
        }
        return count >= n.min && k(pos);
    }
    bool one(const Node& n, size_t pos, const Cont& k) {
        switch (n.kind) {
            case Node::Kind::kSet:
                return pos < s.size() && n.set[static_cast<unsigned char>(s[pos])] && k(pos + 1);
            case Node::Kind::kBegin:
                return pos == 0 && k(pos);
            case Node::Kind::kEnd:
                return pos == s.size() && k(pos);
            case Node::Kind::kGroup:
                for (const Branch& b : n.branches)
                    if (seq(b, 0, pos, k)) return true;
                return false;
        }
        return false;
    }
};

}  // namespace

ModulePattern ModulePattern::parse(const std::string& entry, const std::string& where,
                                   const std::string& field) {
    ModulePattern m;
    m.text_ = entry;
    m.where_ = where + ": field '" + field + "'";
    if (entry.rfind("re:", 0) == 0) {
        const std::string re = entry.substr(3);
        if (re.size() > kMaxPatternBytes)
            throw Error(m.where_ + " is a regular expression of " + std::to_string(re.size()) +
                        " bytes (at most " + std::to_string(kMaxPatternBytes) + ")");
        m.kind_ = Kind::kRegex;
        m.regex_ = Parser(re, m.where_).parse();
    } else if (entry == "Linear") {
        m.kind_ = Kind::kLinear;
    } else if (entry.empty()) {
        throw Error(m.where_ + " is empty (expected a module name, Linear or re:PATTERN)");
    }
    return m;
}

bool ModulePattern::matches(const std::string& module) const {
    switch (kind_) {
        case Kind::kName:
            return module == text_;
        case Kind::kLinear:
            return true;
        case Kind::kRegex: {
            Matcher m{module, where_, text_};
            const Cont done = [](size_t) { return true; };
            for (const Branch& b : regex_)
                if (m.seq(b, 0, 0, done)) return true;
            return false;
        }
    }
    return false;
}

}  // namespace markbase
