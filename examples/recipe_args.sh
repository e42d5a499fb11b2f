# The command-line parsing every shell recipe shares (sourced, never run). A recipe declares its flags, parses, then
# checks the environment variables it reads as numbers, all before it does any work:
#
#   source "$(dirname "$0")/../recipe_args.sh"
#   recipe_flag --out OUT DIR            # --out VALUE sets OUT (the recipe sets the default before); DIR: for messages
#   recipe_flag --workers WORKERS int    # the value must be a whole number (number: a decimal such as 5e-5)
#   recipe_flag --dry-run DRY =1         # a flag without a value: sets DRY to 1
#   recipe_flag --contexts CONTEXTS article\|paragraph   # one of these values
#   recipe_parse "$@"                    # -h / --help prints the recipe's `usage` function, else its header comment
#   set -- "${RECIPE_ARGS[@]}"           # the arguments that are not flags, in order (bash >= 4.4 with set -u)
#   recipe_env int UPDATES SEED          # each of these variables, when set, must be a whole number
#   recipe_env number LR MAX_HOURS
#
# Each mistake stops the recipe with exit status 2 and a line naming the flag or variable at fault: a flag given
# without its value (or followed by another --flag), an unknown flag (with the list of those the recipe takes), a value
# that is not a whole number, a number or one of the choices where one is expected. A whole number is stored without
# leading zeros, so that shell arithmetic does not read 08 as octal. A flag of kind DIR refuses an empty value (a
# folder named '' would become the current one, or / once a recipe appends to it).
#
# A recipe removes only what it made itself. The folders it writes into are its own: recipe_own_dir (before any work)
# accepts a folder that is missing, empty or holds the marker file the recipe left there on an earlier run (a re-run
# redoes or resumes its outputs), and stops naming the folder and its flag otherwise; recipe_claim_dir (just before
# the first write) makes the folder and leaves the marker:
#
#   recipe_own_dir --out "$OUT"          # or WORK (an environment variable), DEST (an argument)
#   recipe_claim_dir "$OUT"

RECIPE_ARGS=()
_recipe_flags=() _recipe_vars=() _recipe_kinds=()
_recipe_number='^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$'

recipe_die() {
    echo "$0: $*" >&2
    exit 2
}

# recipe_flag FLAG VARIABLE [KIND]: KIND is int, number, =VALUE, the choices (paragraph\|article), or what any other
# text value is, such as DIR (the default: VALUE), for the messages
recipe_flag() {
    _recipe_flags+=("$1") _recipe_vars+=("$2") _recipe_kinds+=("${3:-VALUE}")
}

# recipe_check KIND SHOWN VALUE: stop, naming SHOWN (--flag VALUE or NAME=VALUE), unless VALUE is of KIND
recipe_check() {
    case "$1" in
        int) [[ "$3" =~ ^[0-9]+$ ]] || recipe_die "$2: expected a whole number" ;;
        number) [[ "$3" =~ $_recipe_number ]] || recipe_die "$2: expected a number" ;;
        *"|"*) [[ "|$1|" == *"|$3|"* ]] || recipe_die "$2: expected ${1//|/ or }" ;;
        DIR) [[ -n "$3" ]] || recipe_die "${2% }: expected a folder, got an empty value" ;;
    esac
}

_recipe_set() {  # _recipe_set KIND VARIABLE VALUE (after recipe_check)
    if [[ "$1" == int ]]; then printf -v "$2" '%s' "$((10#$3))"; else printf -v "$2" '%s' "$3"; fi
}

_recipe_help() {
    if declare -F usage >/dev/null; then
        usage
    else
        sed -n '2,/^[^#]/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'
    fi
}

_recipe_known() {  # the flags this recipe takes, for the unknown-flag message
    local i known=""
    for ((i = 0; i < ${#_recipe_flags[@]}; i++)); do
        case "${_recipe_kinds[i]}" in
            =*) known+="${_recipe_flags[i]}, " ;;
            int) known+="${_recipe_flags[i]} N, " ;;
            number) known+="${_recipe_flags[i]} X, " ;;
            *) known+="${_recipe_flags[i]} ${_recipe_kinds[i]}, " ;;
        esac
    done
    echo "${known}-h / --help"
}

recipe_parse() {
    RECIPE_ARGS=()
    local i found kind
    while (($#)); do
        case "$1" in
            -h | --help) _recipe_help; exit 0 ;;
            -?*)
                found=-1
                for ((i = 0; i < ${#_recipe_flags[@]}; i++)); do
                    [[ "${_recipe_flags[i]}" != "$1" ]] || found=$i
                done
                ((found >= 0)) || recipe_die "unknown flag $1 (it takes $(_recipe_known))"
                kind="${_recipe_kinds[found]}"
                if [[ "$kind" == =* ]]; then
                    printf -v "${_recipe_vars[found]}" '%s' "${kind#=}"
                    shift
                    continue
                fi
                (($# >= 2)) || recipe_die "$1 needs a value"
                [[ "$2" != --?* ]] || recipe_die "$1 needs a value (got the flag $2)"
                recipe_check "$kind" "$1 $2" "$2"
                _recipe_set "$kind" "${_recipe_vars[found]}" "$2"
                shift 2
                ;;
            *) RECIPE_ARGS+=("$1"); shift ;;
        esac
    done
}

recipe_env() {  # recipe_env KIND NAME...: each variable NAME that is set and not empty must be of KIND
    local kind="$1" name
    shift
    for name in "$@"; do
        [[ -n "${!name:-}" ]] || continue
        recipe_check "$kind" "$name=${!name}" "${!name}"
        _recipe_set "$kind" "$name" "${!name}"
    done
}

# The marker file a recipe leaves in a folder it made; it holds the recipe's path in the repository.
RECIPE_MARKER=.made-by-recipe
_recipe_me=$(realpath --relative-to="$(dirname "$(dirname "$(realpath "${BASH_SOURCE[0]}")")")" "$(realpath "$0")")

_recipe_shown() {  # _recipe_shown NAME DIR: how the messages show the setting: --out DIR, or WORK=DIR
    if [[ "$1" == -* ]]; then echo "$1 $2"; else echo "$1=$2"; fi
}

# recipe_own_dir NAME DIR: stop (status 2) unless DIR can be this recipe's own folder. NAME is the flag, variable or
# argument that gave DIR, for the messages.
recipe_own_dir() {
    local shown made
    shown=$(_recipe_shown "$1" "$2")
    [[ -n "$2" ]] || recipe_die "$1: expected a folder, got an empty value"
    if [[ -f "$2/$RECIPE_MARKER" ]]; then
        made=$(cat "$2/$RECIPE_MARKER")
        [[ "$made" == "$_recipe_me" ]] ||
            recipe_die "$shown: that folder was made by $made, not by $_recipe_me; give another $1"
        return 0
    fi
    [[ ! -e "$2" || -d "$2" ]] || recipe_die "$shown: not a folder"
    [[ ! -d "$2" || -z "$(ls -A "$2")" ]] ||
        recipe_die "$shown: that folder holds files $_recipe_me did not make (it has no $RECIPE_MARKER)," \
            "and $_recipe_me writes into and removes from only a folder of its own: give a new or empty $1"
}

recipe_claim_dir() {  # recipe_claim_dir DIR: make DIR (passed by recipe_own_dir) and leave the marker in it
    mkdir -p "$1"
    [[ -f "$1/$RECIPE_MARKER" ]] || echo "$_recipe_me" >"$1/$RECIPE_MARKER"
}
