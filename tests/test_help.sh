#!/usr/bin/env bash
# test_help.sh - every command's options, said the same way everywhere. `ringtrain --help` names the
# commands; for each command CMD, the options of `ringtrain CMD --help` (its lines "  -x, --name ...")
#   - are the options the README's section "### `ringtrain CMD`" mentions, no more and no fewer
#     (--help aside, which the introduction of "## Commands" gives to every command; options the
#     README gives to another command, as in "`train --json`", are checked against that command's
#     --help instead);
#   - are the options of its parser's table (tools/cmd_CMD.c, CLI_RUN_OPTIONS from tools/cli.h), taking
#     an argument exactly where the help shows one;
#   - are each accepted by the parser, asked so that nothing can start: an option that takes an
#     argument is given last, without one, and must draw getopt's "requires an argument"; any other is
#     followed by an option that exists nowhere, which the parser must be the one to refuse;
#   - each appear in the man page MAN_DIR/ringtrain-CMD.1 (help2man, docs/CMakeLists.txt).
# Also: every --help prints to stdout and exits 0, -h prints the same, and ringtrain.1 exists with the
# top-level options and a SEE ALSO naming every command's page. help2man is a build dependency, so a
# missing man page is a failure, not a skip.
# Usage: test_help.sh RINGTRAIN README.md MAN_DIR. Exit 0 pass, 1 fail.
set -u
RT=${1:?usage: test_help.sh RINGTRAIN README.md MAN_DIR}
README=${2:?usage: test_help.sh RINGTRAIN README.md MAN_DIR}
MAN=${3:?usage: test_help.sh RINGTRAIN README.md MAN_DIR}
SRC=$(cd "$(dirname "$README")" && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/rt-help-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
checks=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
check() { checks=$((checks + 1)); }

command -v perl >/dev/null || { echo "FAIL: test_help.sh needs perl (help2man does too)" >&2; exit 1; }
[ -x "$RT" ] || { echo "FAIL: no binary at $RT" >&2; exit 1; }
RT=$(cd "$(dirname "$RT")" && pwd)/$(basename "$RT") # the probes run in $T
[ -f "$README" ] || { echo "FAIL: no README at $README" >&2; exit 1; }

# help_options FILE: one line per option line of a --help text: "LONG SHORT KIND", LONG or SHORT "-"
# when there is none, KIND none, required or optional (what follows the last name on the line:
# "--name ARG", "--name [ARG]" or "--name=ARG", or two spaces and the description).
help_options() {
    perl -ne 'next unless /^ {1,10}(-[A-Za-z0-9](?=[ ,]))?(?:, )?(--[a-z0-9][a-z0-9-]*)?(.?.?)/ && ($1 || $2);
              my ($s, $l, $t) = ($1 // "-", $2 // "-", $3);
              my $k = $t =~ /^(=|\s\[)/ ? "optional" : $t =~ /^\s\S/ ? "required" : "none";
              print "$l $s $k\n"' "$1"
}

# table_options CMD: the parser's getopt_long table, "LONG KIND" per entry; the names a strcmp() parser
# compares argv with ("none"); nothing when the source is not there.
table_options() {
    local c=$SRC/tools/cmd_$1.c
    [ -f "$c" ] || return 0
    {
        cat "$c"
        grep -q CLI_RUN_OPTIONS "$c" && sed -n '/#define CLI_RUN_OPTIONS/,/^$/p' "$SRC/tools/cli.h"
    } | perl -ne 'print "--$1 $2\n" while /\{"([a-z0-9][a-z0-9-]*)", *(no|required|optional)_argument/g;
                  print "$1 no\n" while /strcmp\(argv\[[^]]*\], *"(--?[a-zA-Z0-9-]+)"\)/g;
                  if (/getopt_long\(argc, *argv, *"([^"]*)"/) {
                      my $s = $1;
                      print "-$1 ", ($2 ? "required" : "none"), "\n" while $s =~ /([A-Za-z0-9])(:?)/g;
                  }' |
        sed 's/ no$/ none/' | sort -u
}

# man_text PAGE: the page as text, roff's "\-" and font changes undone.
man_text() { sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' -e 's/\\f(CW//g' "$1"; }
# has_option FILE OPT: OPT appears in FILE as a word of its own.
has_option() { grep -Eq -- "(^|[^A-Za-z0-9_-])$2([^A-Za-z0-9_-]|\$)" "$1"; }
# check_man PAGE OPTS OUT WHAT: the man page exists (else WHAT says why) and mentions every option of the
# help_options list OPTS; its text is left in OUT.
check_man() {
    local page=$1 opts=$2 out=$3 what=$4 long short kind o
    check
    if [ ! -s "$page" ]; then
        fail "no man page $page ($what)"
        return 1
    fi
    man_text "$page" >"$out"
    while read -r long short kind; do
        for o in $long $short; do
            [ "$o" = - ] || has_option "$out" "$o" || fail "${page##*/} does not mention $o"
        done
    done <"$opts"
}

# readme_options "CMD CMD ...": from the README's "## Commands" part, "SECTION CMD OPTION" for every option it
# mentions. SECTION is the command of the "### `ringtrain NAME`" heading above ("-" before the first);
# CMD the command the option is given to: SECTION's unless the words before it name another
# ("ringtrain train ...", "`train --json`"), "TOP" for `ringtrain --version`, and options of other
# programs (mpirun, srun, python3) are left out. Also "SECTION NAME -" for each heading.
readme_options() {
    perl -e '
        my %cmds = map { $_ => 1 } split / /, shift;
        my ($in, $sect, $fence, $cont) = (0, "-", "", "");
        sub opts_after { my ($ctx, @w) = @_; for (@w) { print "$sect $ctx $1\n" if /^(--[a-z0-9][a-z0-9-]*)/ } }
        # The words of a shell command or a code span: after "ringtrain CMD" the options are those of
        # CMD, after a bare "ringtrain" those of ringtrain itself (TOP); a span that starts with a
        # command name ("train --json") gives them to that command, one that starts with an option to
        # the section; any other program (mpirun, srun, python3) has options that are not ours.
        sub words {
            my ($text, $span) = @_;
            my @w = split " ", $text;
            for my $i (0 .. $#w) {
                next unless $w[$i] =~ m{(^|/)ringtrain$};
                my $ctx = ($i < $#w && $cmds{$w[$i + 1]}) ? $w[$i + 1] : "TOP";
                opts_after($ctx, @w[$i + 1 .. $#w]);
                return;
            }
            return unless @w;
            if ($cmds{$w[0]}) { opts_after($w[0], @w) }
            elsif ($span && $w[0] =~ /^-/) { opts_after($sect, @w) }
        }
        sub prose {
            my @parts = split /`/, shift, -1;
            for my $i (0 .. $#parts) {
                if ($i % 2) { words($parts[$i], 1) } else { opts_after($sect, split /[\s(),;:]+/, $parts[$i]) }
            }
        }
        # Prose is read a paragraph at a time, since a code span may go on to the next line; a table
        # row, a heading and a line of a code block that is not a shell script stand alone.
        my $para = "";
        sub flush { prose($para) if $para ne ""; $para = "" }
        while (<>) {
            chomp;
            if (/^## /) { flush(); $in = /^## Commands\s*$/; next }
            next unless $in;
            if (/^```(\w*)/) { flush(); $fence = $fence ? "" : ($1 || "text"); next }
            if ($fence =~ /^(sh|bash|console)$/ && !/^\s*#/) {
                $_ = $cont . $_; $cont = "";
                if (s/\\$//) { $cont = "$_ "; next }
                my $comment = s/\s#\s.*$// ? $& : "";
                words($_, 0) for split /&&|\|\||[|;]|\$\(|\)/;
                prose($comment) if $comment;
            } elsif ($fence) {
                prose($_);
            } elsif (/^### `ringtrain ([a-z0-9-]+)`/) {
                flush(); $sect = $1; print "$sect $sect -\n";
            } elsif (/^\s*$/) {
                flush();
            } elsif (/^(#|\|)/) {
                flush(); prose($_);
            } else {
                $para .= " $_";
            }
        }
        flush();
    ' "$1" "$README"
}

# ---- ringtrain --help: the commands, the top-level options, ringtrain.1 ------------------------------
check
"$RT" --help >"$T/top.out" 2>"$T/top.err"
rc=$?
[ "$rc" -eq 0 ] || fail "ringtrain --help exits $rc, not 0"
[ -s "$T/top.err" ] && fail "ringtrain --help writes to stderr: $(head -1 "$T/top.err")"
cmds=$(sed -n '/^Commands:/,/^$/s/^  \([a-z][a-z0-9-]*\)  .*/\1/p' "$T/top.out" | tr '\n' ' ')
[ -n "$cmds" ] || { fail "ringtrain --help lists no commands (a \"Commands:\" block of \"  NAME  summary\")"; exit 1; }
echo "commands: $cmds"
help_options "$T/top.out" >"$T/top.opts"
[ -s "$T/top.opts" ] || fail "ringtrain --help lists no options"
check
"$RT" -h >"$T/top.h" 2>&1
cmp -s "$T/top.out" "$T/top.h" || fail "ringtrain -h does not print what --help does"
while read -r long short kind; do
    for o in $long $short; do
        [ "$o" = - ] && continue
        check
        case $o in --help | -h) continue ;; esac
        "$RT" "$o" >"$T/o" 2>"$T/e"
        rc=$?
        [ "$rc" -eq 0 ] && [ -s "$T/o" ] || fail "ringtrain $o: exit $rc, or nothing on stdout"
    done
done <"$T/top.opts"
if check_man "$MAN/ringtrain.1" "$T/top.opts" "$T/top.man" "the build makes it with help2man: docs/CMakeLists.txt"; then
    for c in $cmds; do
        check
        sed -n '/^\.SH "\{0,1\}SEE ALSO/,/^\.SH/p' "$T/top.man" | grep -q "ringtrain-$c" ||
            fail "the SEE ALSO of ringtrain.1 does not name ringtrain-$c(1)"
    done
fi

# ---- the README: who each option is given to --------------------------------------------------------
readme_options "$cmds" >"$T/readme" || { fail "could not read $README"; exit 1; }
grep -q ' -$' "$T/readme" || { fail "$README has no \"## Commands\" part with \"### \`ringtrain CMD\`\" sections"; exit 1; }

# ---- each command ------------------------------------------------------------------------------------
for c in $cmds; do
    check
    "$RT" "$c" --help >"$T/$c.out" 2>"$T/$c.err"
    rc=$?
    [ "$rc" -eq 0 ] || fail "ringtrain $c --help exits $rc, not 0"
    [ -s "$T/$c.err" ] && fail "ringtrain $c --help writes to stderr: $(head -1 "$T/$c.err")"
    head -1 "$T/$c.out" | grep -q "^Usage: ringtrain $c" || fail "ringtrain $c --help does not start with \"Usage: ringtrain $c\""
    help_options "$T/$c.out" >"$T/$c.opts"
    grep -q '^--help ' "$T/$c.opts" || fail "ringtrain $c --help does not list --help"
    if grep -q '^--help -h ' "$T/$c.opts"; then
        check
        "$RT" "$c" -h >"$T/$c.h" 2>&1
        cmp -s "$T/$c.out" "$T/$c.h" || fail "ringtrain $c -h does not print what --help does"
    fi
    awk '{print $1}' "$T/$c.opts" | grep -v '^-$' | sort -u >"$T/$c.help"

    # The parser's table against the help: the same names, an argument where the help shows one.
    table_options "$c" >"$T/$c.table"
    if [ -s "$T/$c.table" ]; then
        awk '{if ($1 != "-") print $1, $3; if ($2 != "-") print $2, $3}' "$T/$c.opts" | sort -u >"$T/$c.helpkinds"
        while read -r o kind; do
            check
            hk=$(awk -v o="$o" '$1 == o {print $2}' "$T/$c.helpkinds")
            if [ -z "$hk" ]; then
                fail "$c: the parser accepts $o ($SRC/tools/cmd_$c.c), \`ringtrain $c --help\` does not list it"
            elif [ "$hk" != "$kind" ]; then
                fail "$c $o: the parser's argument is $kind, the help shows $hk"
            fi
        done <"$T/$c.table"
        while read -r o kind; do
            check
            grep -q -- "^$o " "$T/$c.table" ||
                fail "$c: \`ringtrain $c --help\` lists $o, which the parser's table does not have"
        done <"$T/$c.helpkinds"
    fi

    # Each option the help lists, asked of the parser.
    while read -r long short kind; do
        for o in $long $short; do
            [ "$o" = - ] && continue
            case $o in --help | -h) continue ;; esac
            check
            case $o in --*) q="'$o'" ;; *) q="'${o#-}'" ;; esac
            if [ "$kind" = required ]; then
                (cd "$T" && timeout 60 "$RT" "$c" "$o" >/dev/null 2>"$T/e")
                rc=$?
                if grep -Eq "(unrecognized|invalid) option.*$q" "$T/e"; then
                    fail "$c: the parser does not accept $o, which --help lists"
                elif [ "$rc" -ne 2 ] || ! grep -q "requires an argument.*$q\|option $q requires an argument" "$T/e"; then
                    fail "$c $o: --help shows an argument, but without one it exits $rc with: $(head -2 "$T/e" | tr '\n' ' ')"
                fi
            else
                (cd "$T" && timeout 60 "$RT" "$c" "$o" --zz-no-such-option >/dev/null 2>"$T/e")
                rc=$?
                if grep -Eq "(unrecognized|invalid) option.*$q|$q doesn't allow" "$T/e"; then
                    fail "$c: the parser does not accept $o, which --help lists"
                elif grep -q "requires an argument.*$q\|option $q requires an argument" "$T/e"; then
                    fail "$c $o: the parser wants an argument, --help shows none"
                elif [ "$rc" -ne 2 ] || ! grep -q "unrecognized option '--zz-no-such-option'" "$T/e"; then
                    fail "$c $o: the probe \`ringtrain $c $o --zz-no-such-option\` exits $rc with: $(head -2 "$T/e" | tr '\n' ' ')"
                fi
            fi
        done
    done <"$T/$c.opts"

    # The README: its section mentions exactly the options of the help (--help aside: every command
    # has it, and the "## Commands" introduction says so once).
    check
    if ! grep -q "^$c $c -$" "$T/readme"; then
        fail "the README has no section \"### \`ringtrain $c\`\" under \"## Commands\""
    else
        awk -v c="$c" '$1 == c && $2 == c && $3 != "-" {print $3}' "$T/readme" | grep -vx -- --help |
            sort -u >"$T/$c.readme"
        grep -vx -- --help "$T/$c.help" >"$T/$c.helpnh"
        for o in $(comm -23 "$T/$c.helpnh" "$T/$c.readme"); do
            fail "$c: $o is in \`ringtrain $c --help\` but not in the README's section of $c"
        done
        for o in $(comm -13 "$T/$c.helpnh" "$T/$c.readme"); do
            fail "$c: the README's section of $c mentions $o, which \`ringtrain $c --help\` does not list"
        done
    fi

    # The man page.
    check_man "$MAN/ringtrain-$c.1" "$T/$c.opts" "$T/$c.man" "RT_MAN_COMMANDS in docs/CMakeLists.txt lacks $c?"
done

# Options the README gives to a command outside that command's section ("`train --json`" under
# loadbench), to ringtrain itself (TOP), or to every command (the introduction, "-"): each must be one
# the command lists.
while read -r sect c o; do
    [ "$o" = - ] && continue
    [ "$c" = "$sect" ] && [ "$c" != - ] && continue
    check
    case $c in
    TOP) grep -q -- "^$o " "$T/top.opts" || fail "README, section $sect: \`ringtrain $o\`: ringtrain --help does not list $o" ;;
    -) for d in $cmds; do
           grep -qx -- "$o" "$T/$d.help" || fail "README, \"## Commands\": $o is not an option of every command ($d lacks it)"
       done ;;
    *) if [ -f "$T/$c.help" ]; then
           grep -qx -- "$o" "$T/$c.help" ||
               fail "README, section $sect: $o is given to \`ringtrain $c\`, whose --help does not list it"
       else
           fail "README, section $sect: $o is given to $c, which is not a command of ringtrain --help"
       fi ;;
    esac
done <"$T/readme"

if [ "$fails" -ne 0 ]; then
    echo "test_help: $fails of $checks checks failed"
    exit 1
fi
echo "test_help: all $checks checks passed ($(echo $cmds | wc -w) commands)"
exit 0
