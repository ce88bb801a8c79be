"""Pool passwords (router/config/passwords.py): Artemis's masked values, the environment, files, and the
config errors they give.

The reference values come from a small Java program compiled and run at test time with the JDK
on this machine. It takes the same steps as Artemis's `DefaultSensitiveStringCodec` two-way
algorithm: `Cipher.getInstance("Blowfish")` (Blowfish/ECB/PKCS5Padding) with the key's bytes,
`doFinal` of the password's UTF-8 bytes, `new BigInteger(ciphertext).toString(16)`; and to decode,
`new BigInteger(hex, 16).toByteArray()` left-padded with zero bytes to a multiple of 8, then
`doFinal` in decrypt mode.
"""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.config import ConfigError, load_config, load_config_text
from router.config.passwords import (
    CODEC_KEY_ENV,
    DEFAULT_CODEC_KEY,
    MAX_PASSWORD_FILE_BYTES,
    codec_key,
    decode_masked,
    is_masked,
    mask,
    resolve_password,
)
from tests.conftest import require_java

if TYPE_CHECKING:
    from pathlib import Path

_JAVA_TIMEOUT_S = 120.0
"""Bound of compiling and running the reference program (about 1 s each here)."""

_MASKER = r"""
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import javax.crypto.Cipher;
import javax.crypto.spec.SecretKeySpec;

/** Masks each line (hex of a UTF-8 password) of args[1] with key args[0], as Artemis encodes. */
public class Masker {
    static byte[] encrypt(byte[] key, byte[] plain) throws Exception {
        Cipher cipher = Cipher.getInstance("Blowfish");
        cipher.init(Cipher.ENCRYPT_MODE, new SecretKeySpec(key, "Blowfish"));
        return cipher.doFinal(plain);
    }

    /** Artemis's decoding steps; "FAILS" when they throw. */
    static String artemisDecode(byte[] key, String hex) {
        try {
            byte[] enc = new BigInteger(hex, 16).toByteArray();
            if (enc.length % 8 != 0) {
                byte[] padded = new byte[(enc.length / 8 + 1) * 8];
                System.arraycopy(enc, 0, padded, padded.length - enc.length, enc.length);
                enc = padded;
            }
            Cipher cipher = Cipher.getInstance("Blowfish");
            cipher.init(Cipher.DECRYPT_MODE, new SecretKeySpec(key, "Blowfish"));
            return new BigInteger(1, cipher.doFinal(enc)).toString(16);
        } catch (Exception e) {
            return "FAILS";
        }
    }

    static void emit(String label, byte[] key, byte[] plain) throws Exception {
        String hex = new BigInteger(encrypt(key, plain)).toString(16);
        System.out.println(label + "\t" + new BigInteger(1, plain).toString(16) + "\t" + plain.length
            + "\t" + hex + "\t" + (artemisDecode(key, hex).equals("FAILS") ? "FAILS" : "ok"));
    }

    public static void main(String[] args) throws Exception {
        byte[] key = args[0].getBytes(StandardCharsets.UTF_8);
        for (String line : Files.readAllLines(Paths.get(args[1]))) {
            byte[] plain = line.isEmpty() ? new byte[0] : new BigInteger(line, 16).toByteArray();
            if (plain.length > line.length() / 2) {  // drop BigInteger's sign byte
                plain = java.util.Arrays.copyOfRange(plain, 1, plain.length);
            }
            emit("given", key, plain);
        }
        // The sign and leading-zero cases, found by search: a ciphertext starting with 0x00 (the
        // hex string is shorter), and one starting 0xFF then a byte >= 0x80 (a negative number
        // whose 0xFF byte vanishes from toByteArray(), which Artemis pads back with zero).
        boolean zero = false, ff = false;
        for (int i = 0; !(zero && ff); i++) {
            byte[] plain = ("pw-" + i).getBytes(StandardCharsets.UTF_8);
            byte[] enc = encrypt(key, plain);
            if (!zero && enc[0] == 0 && enc[1] >= 0) { emit("leading-zero", key, plain); zero = true; }
            if (!ff && enc[0] == (byte) 0xFF && enc[1] < 0) { emit("leading-ff", key, plain); ff = true; }
        }
    }
}
"""

PASSWORDS = ["s3cret", "", "a", "exactly8", "sixteen-bytes-pw", "ünïcødé ✓ 🔑", "x" * 100, "with\nnewline"]


def _java_masks(tmp_path: Path, key: str) -> list[tuple[str, str, str, str]]:
    """(label, password, masked, Artemis's own decoding "ok"/"FAILS") from the Java program."""
    require_java()
    source = tmp_path / "Masker.java"
    source.write_text(_MASKER)
    subprocess.run(["javac", "-d", str(tmp_path), str(source)], check=True, timeout=_JAVA_TIMEOUT_S)
    inputs = tmp_path / "passwords.txt"
    inputs.write_text("".join(p.encode().hex() + "\n" for p in PASSWORDS))
    out = subprocess.run(
        ["java", "-cp", str(tmp_path), "Masker", key, str(inputs)],
        check=True,
        capture_output=True,
        text=True,
        timeout=_JAVA_TIMEOUT_S,
    ).stdout
    rows = []
    for line in out.splitlines():
        label, plain_hex, length, masked, artemis = line.split("\t")
        password = int(plain_hex, 16).to_bytes(int(length), "big").decode()
        rows.append((label, password, masked, artemis))
    return rows


@pytest.fixture(scope="module")
def default_key_rows(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str, str, str]]:
    """The Java program's rows for PASSWORDS and the search cases, with the default key."""
    return _java_masks(tmp_path_factory.mktemp("masker"), "clusterpassword")


class TestJavaReference:
    """Values masked by the JDK the way Artemis masks them, decoded here."""

    def test_decode_masked_reads_every_java_value(
        self, default_key_rows: list[tuple[str, str, str, str]]
    ) -> None:
        assert [row[1] for row in default_key_rows if row[0] == "given"] == PASSWORDS
        for _label, password, masked, _artemis in default_key_rows:
            assert decode_masked(masked) == password

    def test_mask_matches_java_character_for_character(
        self, default_key_rows: list[tuple[str, str, str, str]]
    ) -> None:
        for _label, password, masked, _artemis in default_key_rows:
            assert mask(password) == masked

    def test_known_value_for_the_docs(self, default_key_rows: list[tuple[str, str, str, str]]) -> None:
        assert default_key_rows[0][1:3] == ("s3cret", "22a491639adfdc3a")  # docs/configuration.md

    def test_sign_and_leading_zero_cases(self, default_key_rows: list[tuple[str, str, str, str]]) -> None:
        """Scenario: a ciphertext starting 0x00 prints shorter; one starting 0xFF 0x8x prints as a
        negative number Artemis itself cannot decode (zero padding where 0xFF belongs); both
        decode here."""
        cases = {row[0]: row for row in default_key_rows if row[0] != "given"}
        _, zero_password, zero_masked, zero_artemis = cases["leading-zero"]
        assert len(zero_masked) < 16
        assert zero_artemis == "ok"
        assert decode_masked(zero_masked) == zero_password
        _, ff_password, ff_masked, ff_artemis = cases["leading-ff"]
        assert ff_masked.startswith("-")
        assert ff_artemis == "FAILS"
        assert decode_masked(ff_masked) == ff_password

    def test_custom_key_from_the_environment(self, tmp_path: Path) -> None:
        rows = _java_masks(tmp_path, "another key, 23 bytes!!")
        environ = {CODEC_KEY_ENV: "another key, 23 bytes!!"}
        for _label, password, masked, _artemis in rows:
            assert resolve_password(f"ENC({masked})", environ=environ) == password
        with pytest.raises(ValueError, match="does not decrypt with the codec key"):
            resolve_password(f"ENC({rows[0][2]})", environ={})


class TestCodec:
    def test_is_masked(self) -> None:
        assert is_masked("ENC(22a491639adfdc3a)")
        assert is_masked("ENC()")
        assert not is_masked("enc(22)")
        assert not is_masked("ENC(22")
        assert not is_masked("xENC(22)")

    @pytest.mark.parametrize("value", ["", "0x22", "22 a4", "22_a4", "zz", "--1", "\uff12\uff12"])
    def test_decode_masked_rejects_non_hex_without_quoting_it(self, value: str) -> None:
        with pytest.raises(ValueError, match="the masked password is not a hexadecimal number") as info:
            decode_masked(value)
        assert value not in str(info.value) or not value

    @pytest.mark.parametrize("value", ["0", "22a491639adfdc3b", "-1", "7" * 16])
    def test_decode_masked_wrong_ciphertext(self, value: str) -> None:
        with pytest.raises(ValueError, match="does not decrypt with the codec key") as info:
            decode_masked(value)
        assert value not in str(info.value)

    def test_decode_masked_wrong_key(self) -> None:
        with pytest.raises(ValueError, match=r"does not decrypt|not UTF-8"):
            decode_masked(mask("s3cret" * 4), key=b"not the key")

    @pytest.mark.parametrize("key", [b"abc", b"k" * 57])
    def test_key_length_outside_blowfish_range(self, key: bytes) -> None:
        with pytest.raises(ValueError, match=f"the codec key must be 4 to 56 bytes, got {len(key)}"):
            mask("x", key=key)

    def test_codec_key_blank_variable_means_default(self) -> None:
        assert codec_key({}) == DEFAULT_CODEC_KEY == b"clusterpassword"
        assert codec_key({CODEC_KEY_ENV: "  "}) == DEFAULT_CODEC_KEY
        assert codec_key({CODEC_KEY_ENV: "kéy!"}) == "kéy!".encode()

    @given(st.text(max_size=60))
    def test_mask_then_decode_round_trips(self, password: str) -> None:
        try:
            password.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates are no password
            return
        assert decode_masked(mask(password)) == password


class TestResolvePassword:
    def test_plain_and_masked_text(self) -> None:
        assert resolve_password("s3cret") == "s3cret"
        assert resolve_password("ENC(22a491639adfdc3a)") == "s3cret"

    def test_environment_variable_plain_or_masked(self) -> None:
        environ = {"POOL_PW": "from-env", "POOL_PW_MASKED": "ENC(22a491639adfdc3a)", "EMPTY": ""}
        assert resolve_password("", env="POOL_PW", environ=environ) == "from-env"
        assert resolve_password("", env="POOL_PW_MASKED", environ=environ) == "s3cret"
        assert resolve_password("", env="EMPTY", environ=environ) == ""

    def test_file_relative_to_base_dir_one_line_ending_dropped(self, tmp_path: Path) -> None:
        (tmp_path / "secrets").mkdir()
        (tmp_path / "secrets" / "pw").write_bytes(b"from-file\r\n")
        (tmp_path / "two").write_bytes(b"two-lines\n\n")
        (tmp_path / "masked").write_text("ENC(22a491639adfdc3a)\n")
        assert resolve_password("", file="secrets/pw", base_dir=tmp_path) == "from-file"
        assert resolve_password("", file=str(tmp_path / "two")) == "two-lines\n"
        assert resolve_password("", file="masked", base_dir=tmp_path) == "s3cret"

    def test_more_than_one_source(self) -> None:
        with pytest.raises(ValueError, match="give the password one way only, got text and env="):
            resolve_password("x", env="A", environ={"A": "y"})
        with pytest.raises(ValueError, match="got env= and file="):
            resolve_password("", env="A", file="f", environ={"A": "y"})

    def test_unset_variable(self) -> None:
        with pytest.raises(ValueError, match="environment variable 'NOPE' is not set"):
            resolve_password("", env="NOPE", environ={})

    def test_unreadable_and_non_utf8_files(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match=r"cannot read password file '.*missing': No such file"):
            resolve_password("", file="missing", base_dir=tmp_path)
        (tmp_path / "latin1").write_bytes("pässwörd".encode("latin-1"))
        with pytest.raises(ValueError, match=r"password file '.*latin1' is not UTF-8"):
            resolve_password("", file="latin1", base_dir=tmp_path)

    def test_a_password_file_is_read_within_a_bound(self) -> None:
        """Scenario (hardening review): `file="/dev/zero"` is an error, not a process that grows
        until it dies."""
        with pytest.raises(
            ValueError, match=f"password file '/dev/zero' is over {MAX_PASSWORD_FILE_BYTES} bytes"
        ):
            resolve_password("", file="/dev/zero")

    def test_bad_masked_value_names_its_source_not_the_value(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match="environment variable 'PW': the masked password is not") as info:
            resolve_password("", env="PW", environ={"PW": "ENC(secret-ish)"})
        assert "secret-ish" not in str(info.value)
        (tmp_path / "pw").write_text("ENC(1234)")
        with pytest.raises(ValueError, match=r"password file '.*pw': the masked password does not decrypt"):
            resolve_password("", file="pw", base_dir=tmp_path)


def _router_xml(password_element: str) -> str:
    return f"""<configuration><core>
  <connectors><connector name="b1">tcp://127.0.0.1:21001?probe=mqtt</connector></connectors>
  <acceptors><acceptor name="a">tcp://127.0.0.1:0?router=r</acceptor></acceptors>
  <connection-routers>
    <connection-router name="r">
      <policy name="FIRST_ELEMENT"/>
      <pool>
        <username>prober</username>
        {password_element}
        <static-connectors><connector-ref>b1</connector-ref></static-connectors>
      </pool>
    </connection-router>
  </connection-routers>
</core></configuration>
"""


class TestConfig:
    """The four forms through the one configuration loader."""

    def _password(self, config_text: str, source: str = "router.xml") -> str | None:
        pool = load_config_text(config_text, source=source).routers[0].pool
        assert pool is not None
        return pool.password

    def test_four_forms(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("ROUTER_TEST_POOL_PW", "from-env")
        (tmp_path / "pw.txt").write_text("from-file\n")
        config = tmp_path / "router.xml"
        config.write_text(_router_xml('<password file="pw.txt"/>'))
        assert self._password(_router_xml("<password>s3cret</password>")) == "s3cret"
        assert self._password(_router_xml("<password>ENC(22a491639adfdc3a)</password>")) == "s3cret"
        assert self._password(_router_xml('<password env="ROUTER_TEST_POOL_PW"/>')) == "from-env"
        pool = load_config(config).routers[0].pool  # relative to the configuration file
        assert pool is not None
        assert pool.password == "from-file"
        assert self._password(_router_xml("<password></password>")) is None

    def test_password_never_in_repr(self) -> None:
        pool = load_config_text(_router_xml("<password>ENC(22a491639adfdc3a)</password>")).routers[0].pool
        assert pool is not None
        assert "s3cret" not in repr(pool)
        assert "22a491639adfdc3a" not in repr(pool)

    @pytest.mark.parametrize(
        ("element", "reason"),
        [
            ("<password>ENC(not-hex-s3cret)</password>", "the masked password is not a hexadecimal number"),
            ("<password>ENC(1234abcd)</password>", "the masked password does not decrypt with the codec key"),
            (
                '<password env="ROUTER_TEST_UNSET_VARIABLE"/>',
                "environment variable 'ROUTER_TEST_UNSET_VARIABLE' is not set",
            ),
            (
                '<password file="/nonexistent/pw"/>',
                "cannot read password file '/nonexistent/pw': No such file",
            ),
            ('<password env="A">s3cret</password>', "give the password one way only, got text and env="),
        ],
    )
    def test_errors_name_file_line_and_element_never_the_password(
        self, element: str, reason: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("ROUTER_TEST_UNSET_VARIABLE", raising=False)
        with pytest.raises(ConfigError) as info:
            load_config_text(_router_xml(element), source="router.xml")
        error = info.value
        assert (error.source, error.line, error.element) == ("router.xml", 9, "password")
        assert str(error).startswith(f"router.xml:9: <password>: {reason}")
        for secret in ("s3cret", "not-hex", "1234abcd"):
            assert secret not in str(error)

    @pytest.mark.parametrize(
        ("element", "reason"),
        [
            ('<password env=""/>', "router.xml:9: <password>: attribute 'env' must not be empty, got ''"),
            ('<password vault="x"/>', "attribute 'vault'"),
        ],
    )
    def test_schema_checks_the_attributes(self, element: str, reason: str) -> None:
        with pytest.raises(ConfigError, match=reason):
            load_config_text(_router_xml(element), source="router.xml")
