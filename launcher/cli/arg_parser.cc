#include "launcher/cli/arg_parser.h"

#include <algorithm>
#include <cctype>
#include <regex>

namespace ctrun::launcher {
namespace {

rendezvous::Error usage_error(const std::string& message) {
  return rendezvous::Error{rendezvous::ErrorCode::kBadRequest, message};
}

// argparse names an option by all its strings: "argument -m/--module: ...".
std::string argument_label(const ArgSpec& spec) {
  std::string label;
  for (const auto& name : spec.names) label += (label.empty() ? "" : "/") + name;
  return "argument " + label;
}

// One way an argv element can stand for an option (argparse's option tuple).
struct OptionMatch {
  const ArgSpec* spec = nullptr;
  std::string option_string;  // the option string it names ("--nnodes", "-r")
  // Text attached to it: after '=' (`--nnodes=2`, `-r=3`) or after a short option (`-r3`).
  std::optional<std::string> explicit_arg;
  bool attached_by_equals = false;  // `-m=1`: never the start of further short options
};

// What one argv element is, read as argparse's _parse_optional reads it.
struct Classified {
  bool positional = false;
  std::vector<OptionMatch> matches;  // empty and !positional: an unknown option
};

bool is_short(const std::string& option_string) {
  return option_string.size() >= 2 && option_string[0] == '-' && option_string[1] != '-';
}

class Parser {
 public:
  explicit Parser(const std::vector<ArgSpec>& table) {
    for (const auto& spec : table) {
      for (const auto& name : spec.names) option_strings_.emplace_back(name, &spec);
    }
  }

  const ArgSpec* exact(const std::string& option_string) const {
    for (const auto& [name, spec] : option_strings_) {
      if (name == option_string) return spec;
    }
    return nullptr;
  }

  Classified classify(const std::string& arg) const {
    Classified c;
    if (arg.empty() || arg[0] != '-') {
      c.positional = true;
      return c;
    }
    if (const ArgSpec* spec = exact(arg)) {
      c.matches.push_back({spec, arg, std::nullopt, false});
      return c;
    }
    if (arg.size() == 1) {  // "-" alone (stdin, by convention) is an argument
      c.positional = true;
      return c;
    }
    const auto eq = arg.find('=');
    if (eq != std::string::npos) {
      const std::string name = arg.substr(0, eq);
      if (const ArgSpec* spec = exact(name)) {
        c.matches.push_back({spec, name, arg.substr(eq + 1), true});
        return c;
      }
    }
    c.matches = abbreviations(arg);
    if (!c.matches.empty()) return c;
    // Not an option of ours: a negative number or a text with a space is an argument.
    static const std::regex negative_number(R"(^-\d+$|^-\d*\.\d+$)");
    if (std::regex_match(arg, negative_number) || arg.find(' ') != std::string::npos) {
      c.positional = true;
    }
    return c;
  }

  // argparse's _get_option_tuples: every option string the element could abbreviate.
  std::vector<OptionMatch> abbreviations(const std::string& arg) const {
    std::vector<OptionMatch> out;
    const auto eq = arg.find('=');
    const std::string prefix = arg.substr(0, eq);
    std::optional<std::string> after_equals;
    if (eq != std::string::npos) after_equals = arg.substr(eq + 1);
    const bool long_form = arg.size() >= 2 && arg[1] == '-';
    for (const auto& [name, spec] : option_strings_) {
      if (!long_form && name == arg.substr(0, 2)) {
        out.push_back({spec, name, arg.substr(2), false});  // "-r3": "-r" with "3"
      } else if (spec->abbreviable && name.compare(0, prefix.size(), prefix) == 0) {
        out.push_back({spec, name, after_equals, after_equals.has_value()});
      }
    }
    return out;
  }

 private:
  std::vector<std::pair<std::string, const ArgSpec*>> option_strings_;  // in the table's order
};

}  // namespace

std::string pet_variable(const ArgSpec& spec) {
  std::string name = "PET_" + spec.dest;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::toupper(ch)); });
  return name;
}

std::optional<bool> python_int_is_nonzero(const std::string& text) {
  // Python strips whitespace, then takes [sign] digits with single '_' between digits.
  const char* space = " \t\n\r\f\v";
  const auto first = text.find_first_not_of(space);
  if (first == std::string::npos) return std::nullopt;
  const auto last = text.find_last_not_of(space);
  std::size_t i = first;
  if (text[i] == '+' || text[i] == '-') ++i;
  bool nonzero = false;
  bool previous_digit = false;
  if (i > last) return std::nullopt;
  for (; i <= last; ++i) {
    const char ch = text[i];
    if (ch >= '0' && ch <= '9') {
      nonzero = nonzero || ch != '0';
      previous_digit = true;
    } else if (ch == '_' && previous_digit && i < last) {
      previous_digit = false;  // the next character must be a digit
    } else {
      return std::nullopt;
    }
  }
  if (!previous_digit) return std::nullopt;
  return nonzero;
}

std::optional<long long> python_int(const std::string& text) {
  if (!python_int_is_nonzero(text)) return std::nullopt;
  long long value = 0;
  bool negative = false;
  for (const char ch : text) {
    if (ch == '-') negative = true;
    if (ch < '0' || ch > '9') continue;
    const int digit = ch - '0';
    if (value > (9223372036854775807LL - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return negative ? -value : value;
}

rendezvous::Result<ParsedArgs> parse_args(const std::vector<ArgSpec>& table,
                                          const std::vector<std::string>& argv,
                                          const EnvLookup& env) {
  ParsedArgs out;
  // Defaults first, as argparse reads the variables while the parser is built.
  for (const auto& spec : table) {
    if (spec.env != EnvDefault::kPetVariable) continue;
    const std::string variable = pet_variable(spec);
    const auto text = env(variable);
    if (!text) continue;
    if (spec.kind == ArgKind::kValue) {
      out.values[spec.dest] = ArgValue{*text, variable, true};
      continue;
    }
    const auto on = python_int_is_nonzero(*text);
    if (!on) return usage_error(variable + ": expected 0 or 1, got '" + *text + "'");
    if (*on) out.flags.insert(spec.dest);
  }

  const Parser parser(table);
  std::vector<std::string> unrecognized;
  bool options_ended = false;  // after "--", everything is an argument
  std::size_t i = 0;
  while (i < argv.size()) {
    const std::string& arg = argv[i];
    if (!options_ended && arg == "--") {
      options_ended = true;
      ++i;
      continue;
    }
    const Classified c = options_ended ? Classified{true, {}} : parser.classify(arg);
    if (c.positional) {
      out.script = arg;
      ++i;
      // argparse's pattern for the script takes one "--" after it too, when none came before.
      if (!options_ended && i < argv.size() && argv[i] == "--") ++i;
      out.script_args.assign(argv.begin() + static_cast<std::ptrdiff_t>(i), argv.end());
      break;
    }
    if (c.matches.empty()) {
      unrecognized.push_back(arg);
      ++i;
      continue;
    }
    if (c.matches.size() > 1) {
      std::string names;
      for (const auto& m : c.matches) names += (names.empty() ? "" : ", ") + m.option_string;
      return usage_error("ambiguous option: " + arg + " could match " + names);
    }
    ++i;
    OptionMatch m = c.matches.front();
    // A flag may carry further short options after it ("-mr3"); the loop walks along them.
    while (true) {
      const ArgSpec& spec = *m.spec;
      if (spec.kind == ArgKind::kValue) {
        if (m.explicit_arg) {
          out.values[spec.dest] = ArgValue{*m.explicit_arg, m.option_string, false};
        } else {
          if (i >= argv.size() || argv[i] == "--" || !parser.classify(argv[i]).positional) {
            return usage_error(argument_label(spec) + ": expected one argument");
          }
          out.values[spec.dest] = ArgValue{argv[i], m.option_string, false};
          ++i;
        }
        break;
      }
      if (!m.explicit_arg) {
        out.flags.insert(spec.dest);
        if (spec.kind == ArgKind::kExit) {
          out.exit_dest = spec.dest;
          return out;
        }
        break;
      }
      const std::string& rest = *m.explicit_arg;
      if (!is_short(m.option_string) || rest.empty() || m.attached_by_equals || rest[0] == '-') {
        return usage_error(argument_label(spec) + ": ignored explicit argument '" + rest + "'");
      }
      out.flags.insert(spec.dest);
      if (spec.kind == ArgKind::kExit) {
        out.exit_dest = spec.dest;
        return out;
      }
      const std::string next = std::string("-") + rest[0];
      const ArgSpec* next_spec = parser.exact(next);
      if (next_spec == nullptr) {
        unrecognized.push_back("-" + rest);
        break;
      }
      OptionMatch following{next_spec, next, std::nullopt, false};
      if (rest.size() > 1 && rest[1] == '=') {
        following.explicit_arg = rest.substr(2);
        following.attached_by_equals = true;
      } else if (rest.size() > 1) {
        following.explicit_arg = rest.substr(1);
      }
      m = following;
    }
  }
  if (!unrecognized.empty()) {
    std::string list;
    for (const auto& u : unrecognized) list += (list.empty() ? "" : " ") + u;
    return usage_error("unrecognized arguments: " + list);
  }
  return out;
}

}  // namespace ctrun::launcher
