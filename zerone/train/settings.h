// The settings table: every setting of `zerone train` is one row here, and that row is the only
// place its flag, its JSON keys (zerone's own and DeepSpeed's), its type, range, default, help,
// group, whether ranks must agree on it and whether it can change results are written. The
// command-line flags of `train` and `estimate`, `--help`, the config reader's typing and range
// checks, validate(), the rank-consistency check and `--print-config` all read it (Note [One
// settings table]). Adding a knob is adding a row (and using the field).
//
// Queries (for `zerone plan` and tests): settings(), find_setting(flag), find_setting_by_key(key),
// setting_value_json / setting_value_text, range_text.
//
// Ownership: the table is a static, immutable vector built on first use.
// Thread-safety: settings() may be called from any thread (a function-local static); the rest are
// pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "zerone/train/config.h"

namespace zerone::train {

// The --help sections, in the order they are printed.
enum class SettingGroup { model, data, optimizer, zero, offload, checkpoints, output, run };
const char* setting_group_title(SettingGroup g);

// Where the value lives in TrainConfig.
using SettingField = std::variant<int TrainConfig::*, int64_t TrainConfig::*, uint64_t TrainConfig::*,
                                  float TrainConfig::*, double TrainConfig::*, bool TrainConfig::*,
                                  std::string TrainConfig::*>;

enum class SettingType {
  integer,  // int, int64_t or uint64_t field, range [lo, hi] (and multiple_of)
  number,   // float or double field, range lo..hi with open or closed ends, always finite
  toggle,   // a flag without a value ("--resume"); JSON true/false
  boolean,  // a flag with a value true/false ("--early-step false")
  choice,   // one of `choices`
  text,     // a path or a spec
};

// Commands a setting is a flag of.
enum SettingCommand : unsigned { kTrain = 1u, kEstimate = 2u };

struct Setting {
  std::string flag;                    // "--lr": the name in messages and on the command line
  std::string key;                     // zerone's JSON key ("lr"); --print-config writes it
  std::vector<std::string> aliases;    // other keys meaning the same: DeepSpeed's dotted paths
                                       // ("optimizer.params.lr") and older names ("seq_len")
  SettingGroup group = SettingGroup::run;
  SettingType type = SettingType::text;
  SettingField field;
  double lo = 0, hi = 0;               // integer: [lo, hi]; number: with lo_open / hi_open
  bool lo_open = false, hi_open = false;
  int64_t multiple_of = 0;             // integer: 0 or a step the value must be a multiple of
  std::vector<std::string> choices;    // choice: the allowed values
  std::string help;                    // one line for --help
  std::string default_text;            // the default, as --help shows it
  unsigned commands = kTrain;          // which subcommands take the flag
  std::vector<std::string> cli_aliases;  // other spellings on the command line ("--device-mem")
  bool ranks_must_agree = true;        // part of the start-up consistency check
  bool changes_results = true;         // whether another value can change losses or weights
};

// Every setting, in --help order within each group.
const std::vector<Setting>& settings();
// The row of `flag` ("--lr"), or nullptr.
const Setting* find_setting(std::string_view flag);
// The row whose key or one of whose aliases is `key` ("lr", "optimizer.params.lr"), or nullptr.
const Setting* find_setting_by_key(std::string_view key);
// The nearest key or alias to `key` by edit distance, for "did you mean" (empty when none is close).
std::string nearest_setting_key(std::string_view key, const std::vector<std::string>& extra_candidates = {});

// The value of `s` in `cfg`, as text ("0.0003", "true", "cpu") and as JSON text ("0.0003", "true",
// "\"cpu\""): floats are written in their shortest form that reads back to the same float.
std::string setting_value_text(const Setting& s, const TrainConfig& cfg);
std::string setting_value_json(const Setting& s, const TrainConfig& cfg);
// Whether `cfg` holds the table's default for `s` (a default-constructed TrainConfig's value).
bool setting_is_default(const Setting& s, const TrainConfig& cfg);
// "an integer in 1..65536", "a number in (0, 10]", "fp32, bf16 or fp16", "true or false".
std::string range_text(const Setting& s);
// Checks the value of `s` in `cfg` against its range or choices; throws Error naming the setting
// as the user gave it (setting_name) and what was expected.
void check_setting(const Setting& s, const TrainConfig& cfg);

// The effective settings of `cfg` as a JSON config for --config (zerone's keys): every setting that
// differs from its default, was given, or is needed to pin the run (precision resolved).
std::string effective_config_json(const TrainConfig& cfg, const std::string& resolved_precision);

// The rank-consistency list: (flag, value) of every row with ranks_must_agree, in table order.
std::vector<std::pair<std::string, std::string>> agreeing_settings(const TrainConfig& cfg);
// The results list: (key, value text) of every row with changes_results, in table order. A
// checkpoint records it, and a resume names each setting whose value differs (Note [Settings a
// resume compares] in train/checkpoint.h).
std::vector<std::pair<std::string, std::string>> result_settings(const TrainConfig& cfg);

}  // namespace zerone::train
