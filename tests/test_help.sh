#!/usr/bin/env bash
# test_help.sh - every command's options, said the same way everywhere. `ringtrain --help` names the
# commands; for each command CMD, the options of `ringtrain CMD --help` (its lines "  -x, --name ...")
#   - are the options of its parser's table (tools/cmd_CMD.c: a getopt_long table, or an option table of
#     struct cli_opt rows, with CLI_SHARED rows from tools/cli_run.c), taking an argument exactly where the
#     help shows one;
#   - are each accepted by the parser, asked so that nothing can start: the options without an argument
#     all at once, followed by an option that exists nowhere, which the parser must be the one to refuse
#     (one option at a time when that fails, to name the culprit); an option that takes an argument
#     given last, without one, which must draw getopt's "requires an argument";
#   - each appear in the man page BUILD_DOCS/man/ringtrain-CMD.1 (help2man, docs/CMakeLists.txt).
# The documents: docs/COMMANDS.md, the command reference, is what the build generated from the --help
# texts (BUILD_DOCS/COMMANDS.md, tools/dev/gen_commands_md.sh), byte for byte; no guide (README.md,
# docs/*.md but COMMANDS.md) names an option a command does not have: in a section whose heading names
# "`ringtrain CMD`" every --option is CMD's, unless the words before it give it to another command
# ("ringtrain train --json", "`train --json`") or to ringtrain itself; every command has such a section;
# and every relative link of README.md and docs/*.md leads to a file and heading that exist
# (tests/check_doc_links.py).
# Also: every --help prints to stdout and exits 0, -h prints the same, and ringtrain.1 exists with the
# top-level options and a SEE ALSO naming every command's page. help2man is a build dependency, so a
# missing man page is a failure, not a skip.
# Usage: test_help.sh RINGTRAIN DOCS_DIR BUILD_DOCS_DIR (the source's docs/ and the build's docs/, which
# holds man/ and COMMANDS.md). Exit 0 pass, 1 fail.
set -u
usage="usage: test_help.sh RINGTRAIN DOCS_DIR BUILD_DOCS_DIR"
RT=${1:?$usage}
DOCS=${2:?$usage}
BDOCS=${3:?$usage}
[ -d "$DOCS" ] || { echo "FAIL: no docs folder at $DOCS" >&2; exit 1; }
DOCS=$(cd "$DOCS" && pwd)
SRC=$(dirname "$DOCS")
README=$SRC/README.md
MAN=$BDOCS/man
T=$(mktemp -d "${TMPDIR:-/tmp}/rt-help-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
jobs=$(nproc 2>/dev/null || echo 2)
[ "$jobs" -ge 2 ] || jobs=2
[ "$jobs" -le 8 ] || jobs=8
checks=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
check() { checks=$((checks + 1)); }

command -v perl >/dev/null || { echo "FAIL: test_help.sh needs perl (help2man does too)" >&2; exit 1; }
[ -x "$RT" ] || { echo "FAIL: no binary at $RT" >&2; exit 1; }
RT=$(cd "$(dirname "$RT")" && pwd)/$(basename "$RT") # the probes run in $T
[ -f "$README" ] || { echo "FAIL: no README at $README" >&2; exit 1; }
# The guides: the README and docs/*.md, the generated reference aside.
guides=("$README")
for f in "$DOCS"/*.md; do [ "${f##*/}" = COMMANDS.md ] || guides+=("$f"); done

# help_options FILE: one line per option line of a --help text: "LONG SHORT KIND", LONG or SHORT "-"
# when there is none, KIND none, required or optional (what follows the last name on the line:
# "--name ARG", "--name [ARG]" or "--name=ARG", or two spaces and the description).
help_options() {
    perl -ne 'next unless /^ {1,10}(-[A-Za-z0-9](?=[ ,]))?(?:, )?(--[a-z0-9][a-z0-9-]*)?(.?.?)/ && ($1 || $2);
              my ($s, $l, $t) = ($1 // "-", $2 // "-", $3);
              my $k = $t =~ /^(=|\s\[)/ ? "optional" : $t =~ /^\s\S/ ? "required" : "none";
              print "$l $s $k\n"' "$1"
}

# table_options CMD: the parser's table, "LONG KIND" per entry: a getopt_long table, or the rows of an
# option table ({.name = "NAME", .letter = 'X', .arg = "ARG", ...}: an argument when the row has .arg;
# CLI_SHARED(CLI_O_X) rows are tools/cli_run.c's RUN(CLI_O_X) rows, CLI_HELP_ROW is -h, --help); the names
# a strcmp() parser compares argv with ("none"); nothing when the source is not there.
table_options() {
    local c=$SRC/tools/cmd_$1.c
    [ -f "$c" ] || return 0
    {
        perl -ne 'print "--$1 $2\n" while /\{"([a-z0-9][a-z0-9-]*)", *(no|required|optional)_argument/g;
                      print "$1 no\n" while /strcmp\(argv\[[^]]*\], *"(--?[a-zA-Z0-9-]+)"\)/g;
                      if (/getopt_long\(argc, *argv, *"([^"]*)"/) {
                          my $s = $1;
                          print "-$1 ", ($2 ? "required" : "none"), "\n" while $s =~ /([A-Za-z0-9])(:?)/g;
                      }' "$c" |
            sed 's/ no$/ none/'
        perl -0777 -e '
            my ($cmd, $run) = @ARGV;
            sub slurp { open my $f, "<", $_[0] or return ""; local $/; my $t = <$f>; $t }
            # A row: from "{" to its "}", strings skipped whole.
            my $row = qr/\{((?:[^{}"]|"(?:[^"\\]|\\.)*")*)\}/;
            sub show {
                my $r = shift;
                my $kind = $r =~ /\.arg = "/ ? "required" : "none";
                print "--$1 $kind\n" if $r =~ /\.name = "([a-z0-9][a-z0-9-]*)"/;
                print "-$1 $kind\n" if $r =~ /\.letter = \x27([A-Za-z0-9])\x27/;
            }
            my %shared;
            my $rt = slurp($run);
            $shared{$1} = $2 while $rt =~ /RUN\((CLI_O_\w+)\) = $row/g;
            my $t = slurp($cmd);
            show(".name = \"help\", .letter = \x27h\x27") if $t =~ /\bCLI_HELP_ROW\b/;
            while ($t =~ /$row/g) {
                my $r = $1;
                if ($r =~ /CLI_SHARED\((CLI_O_\w+)\)/) { show($shared{$1} // "") }
                elsif ($r =~ /^\.name = "/) { show($r) }
            }' "$c" "$SRC/tools/cli_run.c"
    } | sort -u
}

# man_text PAGE: the page as text, roff's "\-" and font changes undone.
man_text() { sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' -e 's/\\f(CW//g' "$1"; }
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
    # Each option must appear as a word of its own: one perl for the page's options.
    while read -r o; do
        fail "${page##*/} does not mention $o"
    done < <(perl -e 'my ($text, $opts) = @ARGV;
        local $/; open my $t, "<", $text or die; my $page = <$t>;
        open my $o, "<", $opts or die;
        for (split /\n/, <$o>) {
            for my $n ((split " ")[0, 1]) {
                next if $n eq "-";
                print "$n\n" unless $page =~ /(^|[^A-Za-z0-9_-])\Q$n\E([^A-Za-z0-9_-]|$)/m;
            }
        }' "$out" "$opts")
}

# doc_options "CMD CMD ..." FILE...: "FILE:LINE SECTION CMD OPTION" for every option the guides give to a
# command. SECTION is the command a heading of levels 1 to 3 names as "`ringtrain CMD`" (the heading and
# its #### subsections), "-" elsewhere; CMD the command the option is given to: SECTION's unless the words
# before it name another ("ringtrain train ...", "`train --json`"), "TOP" for `ringtrain --version`.
# Outside a command's section an option is only checked where the words before it name the command.
# Options of other programs (mpirun, srun, python3) are left out. Also "FILE:LINE SECTION SECTION -" for
# each heading of a command, and "FILE:LINE ?NAME ?NAME -" for a heading naming `ringtrain NAME` that is
# not a command.
doc_options() {
    perl -e '
        my %cmds = map { $_ => 1 } split / /, shift;
        my ($sect, $fence, $cont, $where) = ("-", "", "", "");
        sub opt { my ($ctx, $o) = @_; print "$where $sect $ctx $o\n" if $ctx ne "-" }
        sub opts_after { my ($ctx, @w) = @_; for (@w) { opt($ctx, $1) if /^(--[a-z0-9][a-z0-9-]*)/ } }
        # The words of a shell command or a code span: after "ringtrain CMD" the options are those of
        # CMD, after a bare "ringtrain" those of ringtrain itself (TOP); a span that starts with a
        # command name ("train --json") gives them to that command, one that starts with an option to
        # the section; any other program (mpirun, srun, python3) has options that are not ours.
        sub words {
            my ($text, $span) = @_;
            my @w = split " ", $text;
            for my $i (0 .. $#w) {
                next unless $w[$i] =~ m{(^|/)ringtrain$};
                next if $i > 0 && $w[$i - 1] =~ /^--?[A-Za-z]/; # the argument of an option: --bin build/ringtrain
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
        my ($para, $pwhere) = ("", "");
        sub flush { my $w = $where; $where = $pwhere; prose($para) if $para ne ""; $para = ""; $where = $w }
        while (<>) {
            chomp;
            $where = "$ARGV:$.";
            if (/^```(\w*)/) { flush(); $fence = $fence ? "" : ($1 || "text"); }
            elsif ($fence =~ /^(sh|bash|console)$/ && !/^\s*#/) {
                $_ = $cont . $_; $cont = "";
                if (s/\\$//) { $cont = "$_ "; next }
                my $comment = s/\s#\s.*$// ? $& : "";
                words($_, 0) for split /&&|\|\||[|;]|\$\(|\)/;
                prose($comment) if $comment;
            } elsif ($fence) {
                prose($_);
            } elsif (/^(#{1,4}) /) {
                flush();
                if (length($1) <= 3) {
                    $sect = "-";
                    if (/`ringtrain ([a-z0-9-]+)`/) {
                        $sect = $cmds{$1} ? $1 : "?$1";
                        print "$where $sect $sect -\n";
                        $sect = "-" if $sect =~ /^\?/;
                    }
                }
                prose($_);
            } elsif (/^\s*$/) {
                flush();
            } elsif (/^\|/) {
                flush(); prose($_);
            } else {
                $pwhere = $where if $para eq "";
                $para .= " $_";
            }
        } continue {
            if (eof) { flush(); ($sect, $fence, $cont) = ("-", "", ""); close ARGV }
        }
    ' "$@"
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

# ---- the documents: the reference as generated, the guides' options, the links -------------------------
check
if [ ! -s "$BDOCS/COMMANDS.md" ]; then
    fail "no $BDOCS/COMMANDS.md: the build makes it (tools/dev/gen_commands_md.sh, docs/CMakeLists.txt)"
elif ! cmp -s "$DOCS/COMMANDS.md" "$BDOCS/COMMANDS.md"; then
    diff -u "$DOCS/COMMANDS.md" "$BDOCS/COMMANDS.md" | head -n 30 >&2
    fail "docs/COMMANDS.md is not what the build generates from --help (diff above); update it with: cmake --build build --target command-reference"
fi
doc_options "$cmds" "${guides[@]}" >"$T/docs" || { fail "could not read the guides"; exit 1; }
check
py=/usr/bin/python3
[ -x "$py" ] || py=python3
"$py" "$SRC/tests/check_doc_links.py" "$README" "$DOCS"/*.md >"$T/links" 2>&1 ||
    { cat "$T/links" >&2; fail "links in README.md and docs/*.md that lead nowhere (above)"; }

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
        # Both ways at once: "nohelp O K" for an entry of the table the help lacks, "kind O K HK" for
        # an argument that differs, "notable O" for an option of the help the table lacks.
        checks=$((checks + $(cat "$T/$c.table" "$T/$c.helpkinds" | wc -l)))
        while read -r why o kind hk; do
            case $why in
            nohelp) fail "$c: the parser accepts $o ($SRC/tools/cmd_$c.c), \`ringtrain $c --help\` does not list it" ;;
            kind) fail "$c $o: the parser's argument is $kind, the help shows $hk" ;;
            notable) fail "$c: \`ringtrain $c --help\` lists $o, which the parser's table does not have" ;;
            esac
        done < <(awk 'FNR == NR { help[$1] = $2; next }
                      { table[$1] = 1
                        if (!($1 in help)) print "nohelp", $1, $2
                        else if (help[$1] != $2) print "kind", $1, $2, help[$1] }
                      END { for (o in help) if (!(o in table)) print "notable", o }' "$T/$c.helpkinds" "$T/$c.table")
    fi

    # Each option the help lists, asked of the parser: those without an argument in one probe, each
    # on its own only when that probe fails (to name the culprit); those with one each on its own.
    flags=()
    while read -r long short kind; do
        [ "$kind" = required ] && continue
        for o in $long $short; do
            case $o in - | --help | -h) ;; *) flags+=("$o") ;; esac
        done
    done <"$T/$c.opts"
    one_by_one=1
    if [ ${#flags[@]} -gt 1 ]; then
        check
        (cd "$T" && timeout 60 "$RT" "$c" "${flags[@]}" --zz-no-such-option >/dev/null 2>"$T/e")
        rc=$?
        if [ "$rc" -eq 2 ] && grep -q "unrecognized option '--zz-no-such-option'" "$T/e" &&
            ! grep -Eq "(unrecognized|invalid) option.*'(-|--)?[a-zA-Z0-9]|requires an argument|doesn't allow" \
                <(grep -v "'--zz-no-such-option'" "$T/e"); then
            one_by_one=0
        fi
    fi
    # The probes run side by side, $jobs at a time (each is a process start and a refusal), and are
    # judged once all have ended.
    n=0
    : >"$T/$c.probes"
    while read -r long short kind; do
        [ "$kind" != required ] && [ "$one_by_one" = 0 ] && continue
        for o in $long $short; do
            case $o in - | --help | -h) continue ;; esac
            n=$((n + 1))
            echo "$n $kind $o" >>"$T/$c.probes"
            if [ "$kind" = required ]; then set -- "$o"; else set -- "$o" --zz-no-such-option; fi
            (cd "$T" && timeout 60 "$RT" "$c" "$@" >/dev/null 2>"$T/p$n.e"; echo $? >"$T/p$n.rc") &
            [ $((n % jobs)) -ne 0 ] || wait
        done
    done <"$T/$c.opts"
    wait
    while read -r n kind o; do
        check
        case $o in --*) q="'$o'" ;; *) q="'${o#-}'" ;; esac
        # Read and matched in the shell: a few hundred probes, no process each.
        read -r rc <"$T/p$n.rc"
        e=
        IFS= read -r -d '' e <"$T/p$n.e"
        first2=${e%%$'\n'*}
        rest=${e#*$'\n'}
        [ "$rest" = "$e" ] || first2="$first2 ${rest%%$'\n'*}"
        if [ "$kind" = required ]; then
            if [[ $e =~ (unrecognized|invalid)\ option.*$q ]]; then
                fail "$c: the parser does not accept $o, which --help lists"
            elif [ "$rc" -ne 2 ] || ! [[ $e == *"requires an argument"*"$q"* || $e == *"option $q requires an argument"* ]]; then
                fail "$c $o: --help shows an argument, but without one it exits $rc with: $first2"
            fi
        else
            if [[ $e =~ (unrecognized|invalid)\ option.*$q || $e == *"$q doesn't allow"* ]]; then
                fail "$c: the parser does not accept $o, which --help lists"
            elif [[ $e == *"requires an argument"*"$q"* || $e == *"option $q requires an argument"* ]]; then
                fail "$c $o: the parser wants an argument, --help shows none"
            elif [ "$rc" -ne 2 ] || [[ $e != *"unrecognized option '--zz-no-such-option'"* ]]; then
                fail "$c $o: the probe \`ringtrain $c $o --zz-no-such-option\` exits $rc with: $first2"
            fi
        fi
    done <"$T/$c.probes"

    # A guide explains it: a heading names `ringtrain CMD`.
    check
    awk -v c="$c" '$2 == c && $3 == c && $4 == "-"' "$T/docs" | grep -q . ||
        fail "no guide (README.md, docs/*.md) has a section whose heading names \`ringtrain $c\`"

    # The man page.
    check_man "$MAN/ringtrain-$c.1" "$T/$c.opts" "$T/$c.man" "RT_MAN_COMMANDS in docs/CMakeLists.txt lacks $c?"
done

# Every option the guides give to a command, in its section or with its name before it: one the command
# lists (ringtrain's own, for TOP). A heading naming `ringtrain NAME` names a command. One awk for all.
{
    awk '{if ($1 != "-") print "TOP", $1; if ($2 != "-") print "TOP", $2}' "$T/top.opts"
    for c in $cmds; do sed "s/^/$c /" "$T/$c.help"; done
} >"$T/known"
checks=$((checks + $(wc -l <"$T/docs")))
awk 'NR == FNR { known[$1 " " $2] = 1; next }
     $4 == "-" { if ($2 ~ /^\?/) print $1 ": the heading names `ringtrain " substr($2, 2) "`, which is not a command of ringtrain --help"; next }
     !(($3 " " $4) in known) {
         if ($3 == "TOP") print $1 ": `ringtrain " $4 "`: ringtrain --help does not list " $4
         else print $1 ": " $4 " is given to `ringtrain " $3 "`, whose --help does not list it" }' "$T/known" "$T/docs" >"$T/docs.bad"
while read -r line; do fail "$line"; done <"$T/docs.bad"

if [ "$fails" -ne 0 ]; then
    echo "test_help: $fails of $checks checks failed"
    exit 1
fi
echo "test_help: all $checks checks passed ($(echo $cmds | wc -w) commands)"
exit 0
