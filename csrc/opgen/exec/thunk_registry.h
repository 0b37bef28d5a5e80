// The thunks a program's kernel lines find (executor_parse.cpp): this module's generated tables,
// and the tables of other modules added at run time under a prefix of their function names, so a
// program of this module's executor calls another extension's kernels (`my_ops__scaled_add.cpu`
// for `scaled_add` registered under "my_ops__"). One registry per module (each links its own
// executor); a mutex guards it, as parsing, its only reader, is not on a call's path. No Python.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "opgen/exec/thunk.h"

namespace opgen::exec {

// This module's own thunks, as it exports them (its `THUNKS` capsule).
const ThunkExport& own_thunks();

// The thunk of `name` (a kernel_ops function, or `<prefix><function>` of a registered module) on
// `backend` ("cpu", "cuda", "default"), or null.
const ThunkEntry* find_thunk(std::string_view name, std::string_view backend);

enum class Registered { kAdded, kUnchanged, kReplaced };

// Adds the thunks of `other` under `prefix`: each entry is found as `prefix + entry.name`. The same
// tables again under a prefix are kUnchanged; other tables replace the prefix's (an extension
// rebuilt and loaded again) for programs parsed from then on, while programs already parsed keep
// calling the thunks they found. The tables are not copied: their module must stay loaded while
// programs call them (Python never unloads an extension).
// std::invalid_argument, registering nothing, where `prefix` is not one or more of A-Z a-z 0-9 _,
// `other` was built for another ABI (thunk.h or torch), or a name it makes is already taken (by
// this module's own thunks or another prefix's).
Registered register_thunks(const std::string& prefix, const ThunkExport& other);

// Each registered prefix and the digest of its thunks, in prefix order.
std::vector<std::pair<std::string, std::string>> registered_thunks();

}  // namespace opgen::exec
