"""Tests for keys/users.py: Java properties syntax, Artemis password hashes and the user/role store."""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keys.users import (
    DEFAULT_ITERATIONS,
    HASH_BYTES,
    SALT_BYTES,
    Authenticated,
    HashedPassword,
    PlainPassword,
    UserStore,
    UserStoreError,
    hash_password,
    parse_properties,
    parse_stored_password,
    verify_password,
)

if TYPE_CHECKING:
    from pathlib import Path

# Real Artemis hashes with their passwords, from apache/activemq-artemis (main, December 2025):
# artemis-commons/src/test/java/org/apache/activemq/artemis/utils/HashProcessorTest.java and
# artemis-server/src/test/resources/users.properties (password "helloworld", per
# PropertiesLoginModuleTest.testLoginMasked).
ARTEMIS_VECTORS = [
    (
        "password",
        "ENC(1024:973A466A489ABFDED3D4B3D181DC77F410F2FC6E87432809A46B72B294147D76:"
        "C999ECA8A85387E1FFB14E4FE5CECD17948BA80BA04318A9BE4C3E34B7FE2925F43AB6BC9DFE0D9855DA67439AEEB985"
        "0351BC4D5D3AEC6A6903C42B8EB4ED1E)",
    ),
    (
        "manager",
        "ENC(1024:48018CDB1B5925DA2CC51DBD6F7E8C5FF156C22C03C6C69720C56F8BE76A1D48:"
        "0A0F68C2C01F46D347C6C51D641291A4608EDA50A873ED122909D9134B7A757C14176F0C033F0BD3CE35B3C373D5B652"
        "650CDE5FFBBB0F286D4495CEFEEDB166)",
    ),
    (
        "helloworld",
        "ENC(1024:439F45267508BB4F02150B9AAFB8D774AB7FCDDE9B19D096F318787487F7BD17:"
        "78818E53AEE8AF26A34A38C1498D1CDA5636861D2FE9804FEDE3656D0BC05696191A027F095DF109EC8F6385FAE99719"
        "15449EC808945A0F5907B29D5F9D44B7)",
    ),
]

# Computed on OpenJDK 17.0.15 with SecretKeyFactory.getInstance("PBKDF2WithHmacSHA1") and
# new PBEKeySpec(password.toCharArray(), salt, 1024, 512), i.e. what Artemis's one-way codec does,
# with the salt bytes 00 01 02 ... 1f. They pin the UTF-8 encoding of the password, including
# Java's "?" for a lone surrogate.
SALT_0_TO_31 = bytes(range(32))
JDK_VECTORS = [
    (
        "password",
        "35381A9F456EA8C6A81F241BB21B0D2CD1BA176597F313E7728E3BB2CD4E1858"
        "DC0CF4387A4A035E5393D752668E013B3704A2B25E32B72223F240047EA3F1DD",
    ),
    (
        "pässwörd€😀",
        "1C011E22878EF93362C1AF8BC7BCB9A3CB810B134CD6D38A56B81D7FFF8ADC20"
        "153D13D10A8D71DC2A73EF3A3FABA8DC86F3D9D063C9EC48A4B0B87C61112730",
    ),
    (
        "a\ud800b",
        "E9C99780BDC7BA1E6B3F32BDDE386707967132EA6F4D001D2966EE6C72D5010A"
        "AE00E385C4968B8EF17501D47CF1B5D769231AB68F222FC1C34DD9A86C509E36",
    ),
]

ENC_FORM = re.compile(r"ENC\((\d+):([0-9A-F]+):([0-9A-F]+)\)")


def _java_escape(text: str) -> str:
    """Escape text the way Properties.store does (every space escaped), for round trips."""
    out = []
    for char in text:
        if char in "\\=:#! ":
            out.append("\\" + char)
        elif char in "\t\n\r\f":
            out.append("\\" + {"\t": "t", "\n": "n", "\r": "r", "\f": "f"}[char])
        elif 0x20 <= ord(char) <= 0x7E:
            out.append(char)
        else:
            out.extend(
                f"\\u{int.from_bytes(unit, 'big'):04X}"
                for unit in _utf16_units(char.encode("utf-16-be", "surrogatepass"))
            )
    return "".join(out)


def _utf16_units(data: bytes) -> list[bytes]:
    return [data[i : i + 2] for i in range(0, len(data), 2)]


# --- parse_properties ---------------------------------------------------------------------------


class TestParseProperties:
    @pytest.mark.parametrize(
        ("text", "key", "value"),
        [
            ("a=1", "a", "1"),
            ("a:1", "a", "1"),
            ("a 1", "a", "1"),
            ("a\t1", "a", "1"),
            ("a\f1", "a", "1"),
            ("a = 1", "a", "1"),
            ("a : 1", "a", "1"),
            ("a  \t=  1", "a", "1"),
            ("a = =1", "a", "=1"),  # only one separator is eaten
            ("a==1", "a", "=1"),
            ("a =:1", "a", ":1"),
            ("a 1 2", "a", "1 2"),
            ("a", "a", ""),
            ("a =", "a", ""),
            ("   a=1", "a", "1"),
            ("a = 1  ", "a", "1  "),  # trailing whitespace belongs to the value
            ("a=1 # not a comment", "a", "1 # not a comment"),
            ("=1", "", "1"),
        ],
    )
    def test_parse_properties_separators(self, text, key, value):
        assert parse_properties(text, "t") == [(1, key, value)]

    @pytest.mark.parametrize(
        ("text", "key", "value"),
        [
            (r"a=tab\there", "a", "tab\there"),
            (r"a=\n\r\f", "a", "\n\r\f"),
            (r"a=\u00e9\u00E9", "a", "éé"),
            (r"a=\u20ac", "a", "€"),
            (r"a=\ud83d\ude00", "a", "😀"),  # a UTF-16 surrogate pair is one character
            (r"a=\ud83d", "a", "\ud83d"),  # a lone surrogate stays as Java keeps it
            (r"a=\q\"", "a", 'q"'),  # any other escaped character is itself
            (r"a=back\\slash", "a", "back\\slash"),
            (r"key\=with\:seps = v", "key=with:seps", "v"),
            (r"key\ with\ spaces v", "key with spaces", "v"),
            (r"\#not-a-comment = v", "#not-a-comment", "v"),
            (r"\!not-a-comment = v", "!not-a-comment", "v"),
            (r"a=\ leading", "a", " leading"),
            (r"\u0061\u003d = v", "a=", "v"),  # an escaped '=' in the key does not split it
        ],
    )
    def test_parse_properties_escapes(self, text, key, value):
        assert parse_properties(text, "t") == [(1, key, value)]

    def test_parse_properties_comments_and_blank_lines_are_skipped(self):
        text = "# comment\n! bang comment\n   # indented comment\n\n \t\f\nuser = pw\n"
        assert parse_properties(text, "t") == [(6, "user", "pw")]

    def test_parse_properties_comment_ending_in_backslash_continues_nothing(self):
        assert parse_properties("# comment \\\na=1", "t") == [(2, "a", "1")]

    def test_parse_properties_continuation_joins_lines_without_leading_whitespace(self):
        text = "a = one, \\\n      two, \\\n\t three\nb = 2"
        assert parse_properties(text, "t") == [(1, "a", "one, two, three"), (4, "b", "2")]

    def test_parse_properties_continuation_line_starting_with_hash_is_data(self):
        assert parse_properties("a = x\\\n  # y", "t") == [(1, "a", "x# y")]

    def test_parse_properties_continuation_before_blank_line_ends_entry(self):
        assert parse_properties("a = x\\\n\nb = y", "t") == [(1, "a", "x"), (3, "b", "y")]

    def test_parse_properties_even_backslashes_do_not_continue(self):
        assert parse_properties("a = x\\\\\nb = y", "t") == [(1, "a", "x\\"), (2, "b", "y")]

    def test_parse_properties_continuation_at_end_of_text_is_dropped(self):
        assert parse_properties("a = x\\", "t") == [(1, "a", "x")]
        assert parse_properties("a = x\\\n", "t") == [(1, "a", "x")]

    def test_parse_properties_continuation_can_split_the_key(self):
        assert parse_properties("us\\\n  er = pw", "t") == [(1, "user", "pw")]

    def test_parse_properties_empty_logical_lines_give_no_entry(self):
        """Scenario: Java gives ("", "") for a final lone backslash; we give nothing."""
        assert parse_properties("\\", "t") == []
        assert parse_properties("a=1\n  \\\n", "t") == [(1, "a", "1")]
        assert parse_properties("\\\n# comment after an empty continuation\nb=2", "t") == [(3, "b", "2")]

    @pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
    def test_parse_properties_line_endings(self, newline):
        text = newline.join(["# c", "a=1", "b = two \\", "  parts", "", "c=3"])
        assert parse_properties(text, "t") == [(2, "a", "1"), (3, "b", "two parts"), (6, "c", "3")]

    def test_parse_properties_mixed_line_endings_count_lines(self):
        assert parse_properties("a=1\r\nb=2\rc=3\nd=4", "t") == [
            (1, "a", "1"),
            (2, "b", "2"),
            (3, "c", "3"),
            (4, "d", "4"),
        ]

    def test_parse_properties_other_unicode_line_breaks_are_data(self):
        # str.splitlines would split here; Properties.load does not.
        assert parse_properties("a=1\u2028b\x85c\x0bd", "t") == [(1, "a", "1\u2028b\x85c\x0bd")]

    def test_parse_properties_keeps_duplicates_in_file_order(self):
        assert parse_properties("a=1\nb=2\na=3", "t") == [(1, "a", "1"), (2, "b", "2"), (3, "a", "3")]

    def test_parse_properties_matches_java_on_tricky_text(self):
        """Scenario: expected entries produced by java.util.Properties.load on OpenJDK 17.0.15."""
        text = (
            "  \f# comment\\\n"
            "k1\\\n"
            "   \\ v\\\\\\\n"
            "  tail  \n"
            "k2 := x\n"
            "\\u006B3\\:x\\=y\\ z=\\t\\u0009\n"
            "k4\\\r\n"
            "\\\r\n"
            "  ! still value\n"
        )
        assert parse_properties(text, "t") == [
            (2, "k1 v\\tail", ""),  # key ends at the first unescaped whitespace
            (5, "k2", "= x"),
            (6, "k3:x=y z", "\t\t"),
            (7, "k4!", "still value"),  # after a continuation '!' is data, not a comment
        ]

    @pytest.mark.parametrize(
        ("text", "where"),
        [
            ("alice = s3cr\\u12zz", "value"),
            ("alice = s3cr\\u12", "value"),
            ("alice = s3cr\\u", "value"),
            ("al\\uXYZWice = s3cr", "key"),
        ],
    )
    def test_parse_properties_malformed_unicode_escape(self, text, where):
        with pytest.raises(
            UserStoreError, match=rf"^users\.properties:3: malformed \\uxxxx escape in {where}$"
        ):
            parse_properties("# header\n\n" + text, "users.properties")

    def test_parse_properties_malformed_escape_message_hides_value(self):
        with pytest.raises(UserStoreError) as info:
            parse_properties("alice = s3cr\\u12zz", "f")
        assert "s3cr" not in str(info.value)
        assert "12zz" not in str(info.value)

    @given(st.lists(st.sampled_from([*"ab=: \t\f\\\r\n#!u0fFé€", "\\u00e9", "\\\n", "\\\r\n"])).map("".join))
    def test_parse_properties_only_raises_user_store_error_on_syntax_text(self, text):
        error: UserStoreError | None = None
        try:
            entries = parse_properties(text, "fuzz")
        except UserStoreError as exc:
            error = exc
        if error is None:
            assert all(line >= 1 for line, _, _ in entries)
        else:
            assert str(error).startswith("fuzz:")

    @given(st.text())
    def test_parse_properties_only_raises_user_store_error_on_any_text(self, text):
        error: UserStoreError | None = None
        try:
            parse_properties(text, "fuzz")
        except UserStoreError as exc:
            error = exc
        assert error is None or "\n" not in str(error)

    @given(
        st.lists(
            st.tuples(st.text(min_size=1), st.text()),
            max_size=5,
        )
    )
    def test_parse_properties_round_trips_java_escaped_entries(self, pairs):
        text = "".join(f"{_java_escape(k)}={_java_escape(v)}\n" for k, v in pairs)
        assert [(k, v) for _, k, v in parse_properties(text, "t")] == [
            (_java_string(k), _java_string(v)) for k, v in pairs
        ]


def _java_string(text: str) -> str:
    """What a Java String read back from \\u escapes gives: surrogate pairs joined."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


# --- passwords ----------------------------------------------------------------------------------


class TestPasswords:
    def test_hash_password_uses_artemis_defaults(self):
        stored = hash_password("secret")
        found = ENC_FORM.fullmatch(stored)
        assert found is not None
        iterations, salt, digest = found.groups()
        assert int(iterations) == DEFAULT_ITERATIONS == 1024
        assert len(bytes.fromhex(salt)) == SALT_BYTES == 32
        assert len(bytes.fromhex(digest)) == HASH_BYTES == 64

    def test_hash_password_draws_a_new_salt_each_time(self):
        assert hash_password("secret") != hash_password("secret")

    def test_hash_password_matches_independent_pbkdf2(self):
        salt = bytes.fromhex("5a" * 32)
        expected = hashlib.pbkdf2_hmac("sha1", b"s3cret", salt, 1024, 64)
        assert hash_password("s3cret", salt=salt) == f"ENC(1024:{'5A' * 32}:{expected.hex().upper()})"

    def test_hash_password_with_other_iterations(self):
        salt = b"\x01" * 16
        expected = hashlib.pbkdf2_hmac("sha1", b"pw", salt, 5, 64).hex().upper()
        assert hash_password("pw", iterations=5, salt=salt) == f"ENC(5:{'01' * 16}:{expected})"
        assert verify_password(hash_password("pw", iterations=5, salt=salt), "pw")

    @pytest.mark.parametrize(("password", "digest"), JDK_VECTORS)
    def test_hash_password_matches_jdk_pbkdf2(self, password, digest):
        assert (
            hash_password(password, salt=SALT_0_TO_31) == f"ENC(1024:{SALT_0_TO_31.hex().upper()}:{digest})"
        )

    @pytest.mark.parametrize(("password", "stored"), ARTEMIS_VECTORS)
    def test_verify_password_accepts_artemis_hashes(self, password, stored):
        assert verify_password(stored, password)
        assert not verify_password(stored, password + "x")
        assert not verify_password(stored, password.upper())

    def test_verify_password_accepts_own_hash(self):
        stored = hash_password("correct horse")
        assert verify_password(stored, "correct horse")
        assert not verify_password(stored, "correct horse ")
        assert not verify_password(stored, "")

    def test_verify_password_accepts_lower_case_hex(self):
        password, stored = ARTEMIS_VECTORS[0]
        assert verify_password(f"ENC({stored[4:-1].lower()})", password)

    def test_verify_password_derives_as_many_bytes_as_stored(self):
        """Scenario: a 20-byte hash (not Artemis's default length) verifies like Artemis's verify."""
        digest = hashlib.pbkdf2_hmac("sha1", b"pw", b"salt", 7, 20)
        stored = f"ENC(7:{b'salt'.hex()}:{digest.hex()})"
        assert verify_password(stored, "pw")
        assert not verify_password(stored, "pW")

    def test_verify_password_plain(self):
        assert verify_password("secret", "secret")
        assert not verify_password("secret", "Secret")
        assert not verify_password("secret", "secret ")
        assert verify_password("", "")
        assert verify_password("pässwörd", "pässwörd")

    def test_verify_password_compares_in_constant_time(self, monkeypatch):
        calls = []
        real = hmac.compare_digest

        def spy(a, b):
            calls.append((type(a), type(b)))
            return real(a, b)

        monkeypatch.setattr(hmac, "compare_digest", spy)
        assert verify_password("plain", "plain")
        assert verify_password(ARTEMIS_VECTORS[1][1], "manager")
        assert calls == [(bytes, bytes), (bytes, bytes)]

    @pytest.mark.parametrize(
        ("stored", "reason"),
        [
            ("ENC()", "got 1 part"),
            ("ENC(1024:ABCD)", "got 2 part"),
            ("ENC(1024:AB:CD:EF)", "got 4 part"),
            ("ENC(1024:AB:CD:)", "got 4 part"),
            ("ENC(0:AB:CD)", "iterations"),
            ("ENC(-1:AB:CD)", "iterations"),
            ("ENC(+5:AB:CD)", "iterations"),
            ("ENC(x:AB:CD)", "iterations"),
            ("ENC(2147483648:AB:CD)", "iterations"),
            ("ENC(1024::CD)", "salt"),
            ("ENC(1024:ABC:CD)", "salt"),
            ("ENC(1024:XY:CD)", "salt"),
            ("ENC(1024:AB:)", "hash"),
            ("ENC(1024:AB:C)", "hash"),
            ("ENC(1024:AB: CD)", "hash"),
        ],
    )
    def test_parse_stored_password_rejects_malformed_hash(self, stored, reason):
        with pytest.raises(ValueError, match=reason) as info:
            parse_stored_password(stored)
        assert "AB" not in str(info.value)
        assert "CD" not in str(info.value)

    @pytest.mark.parametrize("stored", ["ENC(", "ENC(abc", "enc(1:AB:CD)", "xENC(1:AB:CD)", "ENC(1:AB:CD) "])
    def test_parse_stored_password_without_enc_wrapping_is_plain(self, stored):
        """Scenario: as Artemis's isEncMasked, only values starting with ENC( and ending with ) are hashed."""
        assert parse_stored_password(stored) == PlainPassword(text=stored)

    def test_parse_stored_password_hashed(self):
        parsed = parse_stored_password(ARTEMIS_VECTORS[0][1])
        assert isinstance(parsed, HashedPassword)
        assert parsed.iterations == 1024
        assert len(parsed.salt) == 32
        assert len(parsed.digest) == 64
        assert parsed.encode() == ARTEMIS_VECTORS[0][1]

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"iterations": 0}, "iterations"),
            ({"iterations": 2**31}, "iterations"),
            ({"salt": b""}, "salt"),
        ],
    )
    def test_hash_password_rejects_bad_parameters(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            hash_password("pw", **kwargs)

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"iterations": 0, "salt": b"s", "digest": b"d"}, "iterations"),
            ({"iterations": 1, "salt": b"", "digest": b"d"}, "salt"),
            ({"iterations": 1, "salt": b"s", "digest": b""}, "hash"),
        ],
    )
    def test_hashed_password_validates_on_construction(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            HashedPassword(**kwargs)

    def test_stored_password_repr_hides_secrets(self):
        plain = PlainPassword(text="hunter2")
        hashed = parse_stored_password(ARTEMIS_VECTORS[0][1])
        assert "hunter2" not in repr(plain)
        assert repr(plain) == "PlainPassword()"
        assert repr(hashed) == "HashedPassword(iterations=1024)"


# --- the store ----------------------------------------------------------------------------------

USERS = f"""\
## Licensed to the Apache Software Foundation (ASF) ...
alice = wonderland
bob = {ARTEMIS_VECTORS[1][1]}
carol = {hash_password("carol's secret", salt=b"carol-salt")}
empty =
"""

ROLES = """\
# roles in this order: store order
zeta = alice
admins = alice,bob
amq = bob , dave,
alpha = alice, alice
"""


@pytest.fixture
def store_files(tmp_path: Path) -> tuple[Path, Path]:
    users, roles = tmp_path / "artemis-users.properties", tmp_path / "artemis-roles.properties"
    users.write_text(USERS, encoding="iso-8859-1")
    roles.write_text(ROLES, encoding="iso-8859-1")
    return users, roles


@pytest.fixture
def store(store_files: tuple[Path, Path]) -> UserStore:
    return UserStore.load(*store_files)


class TestUserStore:
    def test_authenticate_plain_password_gives_roles_in_store_order(self, store):
        assert store.authenticate("alice", "wonderland") == Authenticated(
            user="alice", roles=("zeta", "admins", "alpha")
        )

    def test_authenticate_hashed_password(self, store):
        assert store.authenticate("bob", "manager") == Authenticated(user="bob", roles=("admins", "amq"))

    def test_authenticate_user_without_roles(self, store):
        assert store.authenticate("carol", "carol's secret") == Authenticated(user="carol", roles=())

    @pytest.mark.parametrize(
        ("user", "password"),
        [
            ("alice", "Wonderland"),
            ("alice", ""),
            ("bob", "wonderland"),
            ("carol", "carol's secret "),
            ("Alice", "wonderland"),  # user names are case-sensitive, as in Java
            ("dave", "anything"),  # has a role but no password entry
            ("mallory", "wonderland"),
            (None, "wonderland"),
            ("alice", None),
            (None, None),
        ],
    )
    def test_authenticate_rejects(self, store, user, password):
        assert store.authenticate(user, password) is None

    def test_authenticate_empty_stored_password(self, store):
        assert store.authenticate("empty", "") == Authenticated(user="empty", roles=())
        assert store.authenticate("empty", None) is None

    def test_authenticate_unknown_user_still_hashes(self, store, monkeypatch):
        """Scenario: an unknown user costs a PBKDF2 run too, so timing does not tell it apart."""
        calls = []
        real = hashlib.pbkdf2_hmac

        def spy(*args):
            calls.append(args[3])
            return real(*args)

        monkeypatch.setattr(hashlib, "pbkdf2_hmac", spy)
        assert store.authenticate("mallory", "pw") is None
        assert calls == [DEFAULT_ITERATIONS]

    def test_load_roles_mapping(self, store):
        assert dict(store.roles) == {
            "alice": ("zeta", "admins", "alpha"),
            "bob": ("admins", "amq"),
            "dave": ("amq",),
        }

    def test_load_users_mapping(self, store):
        assert set(store.users) == {"alice", "bob", "carol", "empty"}
        assert store.users["alice"] == PlainPassword(text="wonderland")
        assert isinstance(store.users["bob"], HashedPassword)

    def test_load_artemis_test_resources(self, tmp_path):
        """Scenario: Artemis's PropertiesLoginModuleTest files; 'first' has two roles there too."""
        users = tmp_path / "users.properties"
        roles = tmp_path / "roles.properties"
        users.write_text(f"first=secret\nsecond=password\nthird={ARTEMIS_VECTORS[2][1]}\n")
        roles.write_text("programmers=first\naccounting=second\nemployees=first,second\n")
        store = UserStore.load(users, roles)
        assert store.authenticate("first", "secret") == Authenticated(
            user="first", roles=("programmers", "employees")
        )
        assert store.authenticate("third", "helloworld") == Authenticated(user="third", roles=())
        assert store.authenticate("BAD", "secret") is None

    def test_load_reads_iso_8859_1_by_default(self, tmp_path):
        users, roles = tmp_path / "u", tmp_path / "r"
        users.write_bytes(b"jos\xe9 = p\xe4ss\n\\u00e5sa = \\u20ac\n")
        roles.write_bytes(b"caf\xe9 = jos\xe9\n")
        store = UserStore.load(users, roles)
        assert store.authenticate("josé", "päss") == Authenticated(user="josé", roles=("café",))
        assert store.authenticate("åsa", "€") == Authenticated(user="åsa", roles=())

    def test_load_utf8_when_asked(self, tmp_path):
        users, roles = tmp_path / "u", tmp_path / "r"
        users.write_text("josé = päss€\n", encoding="utf-8")
        roles.write_text("café = josé\n", encoding="utf-8")
        store = UserStore.load(users, roles, encoding="utf-8")
        assert store.authenticate("josé", "päss€") == Authenticated(user="josé", roles=("café",))
        assert UserStore.load(users, roles).authenticate("josé", "päss€") is None

    def test_load_reports_undecodable_line(self, tmp_path):
        users, roles = tmp_path / "u", tmp_path / "r"
        users.write_bytes(b"a = 1\r\nb = 2\n\xff\xfe = 3\n")
        roles.write_text("")
        with pytest.raises(UserStoreError, match=r"^.*u:3: not valid 'utf-8' text$"):
            UserStore.load(users, roles, encoding="utf-8")

    def test_load_missing_file(self, tmp_path):
        roles = tmp_path / "r"
        roles.write_text("")
        missing = tmp_path / "missing.properties"
        with pytest.raises(
            UserStoreError, match=r"missing\.properties: cannot read file: no such file"
        ) as info:
            UserStore.load(missing, roles)
        assert info.value.line is None
        assert info.value.path == str(missing)

    def test_store_repr_hides_secrets(self, store):
        text = repr(store)
        assert "alice" in text
        assert "wonderland" not in text
        bob = store.users["bob"]
        assert isinstance(bob, HashedPassword)
        assert bob.salt.hex().upper() not in text
        assert bob.digest.hex().upper() not in text
        assert "HashedPassword(iterations=1024)" in text

    def test_store_is_read_only_and_copies_its_input(self):
        users = {"alice": PlainPassword(text="pw")}
        roles: dict[str, tuple[str, ...]] = {"alice": ("r1", "r2")}
        store = UserStore(users=users, roles=roles)
        users["bob"] = PlainPassword(text="pw")
        roles["bob"] = ("r1",)
        assert set(store.users) == {"alice"}
        assert dict(store.roles) == {"alice": ("r1", "r2")}
        with pytest.raises(TypeError):
            store.users["mallory"] = PlainPassword(text="pw")  # type: ignore[index]  # read-only on purpose

    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"users": {"": PlainPassword(text="pw")}}, ValueError, "user names"),
            ({"users": {"a": "pw"}}, TypeError, "stored password"),
            ({"users": {}, "roles": {"": ("r",)}}, ValueError, "user names"),
            ({"users": {}, "roles": {"a": ("r", "r")}}, ValueError, "distinct"),
            ({"users": {}, "roles": {"a": ("",)}}, ValueError, "non-empty"),
        ],
    )
    def test_store_validates_on_construction(self, kwargs, error, match):
        with pytest.raises(error, match=match):
            UserStore(**kwargs)

    def test_parse_without_files(self):
        store = UserStore.parse("u = p", "r = u")
        assert store.authenticate("u", "p") == Authenticated(user="u", roles=("r",))


class TestUserStoreErrors:
    @pytest.mark.parametrize(
        ("users", "roles", "where", "reason"),
        [
            ("a = 1\n\na = 2\n", "", "users.properties:3", "user 'a' defined again (first on line 1)"),
            ("a = 1\n", "r = a\nr = b\n", "roles.properties:2", "role 'r' defined again (first on line 1)"),
            ("a = 1\n = 2\n", "", "users.properties:2", "empty user name"),
            ("", "\n\n= a\n", "roles.properties:3", "empty role name"),
            (
                "a = 1\nbob = ENC(1024:DEADBEEF)\n",
                "",
                "users.properties:2",
                "user 'bob': hashed password must be ENC(<iterations>:<hex salt>:<hex hash>), got 2 part(s)",
            ),
            (
                "bob = ENC(1024:DEADBEEF:XYZ)\n",
                "",
                "users.properties:1",
                "user 'bob': hashed password: hash must be a non-empty even number of hex digits",
            ),
        ],
    )
    def test_parse_errors_name_file_line_and_rule(self, users, roles, where, reason):
        with pytest.raises(UserStoreError) as info:
            UserStore.parse(users, roles, users_source="users.properties", roles_source="roles.properties")
        assert str(info.value) == f"{where}: {reason}"
        assert "DEADBEEF" not in str(info.value)

    def test_load_error_has_path_and_line_and_no_secret(self, tmp_path):
        users, roles = tmp_path / "artemis-users.properties", tmp_path / "artemis-roles.properties"
        users.write_text("# header\nalice = hunter2\nbob = ENC(1024:C0FFEE:hunter2)\n")
        roles.write_text("")
        with pytest.raises(UserStoreError) as info:
            UserStore.load(users, roles)
        error = info.value
        assert (error.path, error.line) == (str(users), 3)
        assert str(error).startswith(f"{users}:3: user 'bob': ")
        assert "hunter2" not in str(error)
        assert "C0FFEE" not in str(error)
        assert error.__cause__ is None
        assert error.__suppress_context__

    def test_user_store_error_str_is_one_line(self):
        assert str(UserStoreError("f", 7, "bad\n  thing")) == "f:7: bad thing"
        assert str(UserStoreError("f", None, "cannot read")) == "f: cannot read"
        error = UserStoreError("f", 7, "why")
        assert isinstance(error, ValueError)
        assert (error.path, error.line, error.reason) == ("f", 7, "why")
