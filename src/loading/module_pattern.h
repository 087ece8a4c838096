// compressed-tensors' "targets" and "ignore" entries (config.json's quantization_config), matched against a
// module's name as compressed-tensors and vLLM match them: "re:PATTERN" is a Python regular expression
// matched at the start of the name (re.match), "Linear" is any linear layer, anything else is a module's full
// name
// ("model.language_model.layers.0.mlp.down_proj", "lm_head").
//
// The regular expressions are read by a small matcher of our own (std::regex trips GCC 12's
// -Wmaybe-uninitialized inside libstdc++ in the sanitizer build): literals, '.', escapes (\. \d \w \s and
// their negations, \A, \Z), classes [a-z_] and [^...], groups (...) and (?:...), alternation '|', the
// quantifiers * + ? {m} {m,} {,n} {m,n} (lazy forms too), '^' and '$'. Anything else (look-arounds, back
// references, \b) is refused by name rather than guessed at. The patterns come from an untrusted file, so
// their length, nesting and matching work are bounded: past the bounds they are refused, never slow or deep.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

namespace markbase {

class ModulePattern {
  public:
    // Throws markbase::Error "<where>: field '<field>' ..." for an entry that is not a supported pattern.
    static ModulePattern parse(const std::string& entry, const std::string& where, const std::string& field);

    // Whether the entry names `module`, a linear layer's full name. Throws markbase::Error (naming the
    // entry's field) when a pattern needs more than a bounded amount of work to decide.
    bool matches(const std::string& module) const;

    const std::string& text() const { return text_; }

    // A regular expression's parsed form.
    struct Node {
        enum class Kind { kSet, kGroup, kBegin, kEnd } kind = Kind::kSet;
        std::bitset<256> set;                     // kSet: the bytes it takes
        std::vector<std::vector<Node>> branches;  // kGroup: the alternatives
        int min = 1, max = 1;                     // repetitions; max -1: unbounded
    };

  private:
    enum class Kind { kName, kLinear, kRegex } kind_ = Kind::kName;
    std::string text_;   // the entry as written
    std::string where_;  // "<file>: field '<field>'" for errors while matching
    std::vector<std::vector<Node>> regex_;
};

}  // namespace markbase
